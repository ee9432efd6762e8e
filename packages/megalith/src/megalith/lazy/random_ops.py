"""Which recorded ops draw random numbers, and the generator state each one drew from.

[Note: replaying a part of the record]
A model too large for one rank is materialised a chunk at a time (chunks.py): for each
chunk only the ops its tensors depend on are replayed (Trace.needed). Replayed alone, a
random op would draw from wherever the generator stands, not from where eager
construction had it, so each draw would depend on which chunk came first. Here the
record is walked once beforehand, running only its random ops, in order, from the
generators' state at the context's entry; each runs on a scratch tensor with its
target's size, stride and storage extent (what a draw consumes depends on those and on
the dtype and device, never on the values), and the generators' state before it is
kept. A partial replay sets that state before each random op it runs
(Trace.replay(states=...)): every value is eager construction's, in any chunk order.
The walk costs the draws of one eager construction and one tensor's scratch at a time.
An op given its own torch.Generator draws from that object as it stands (as before).
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils._pytree import tree_map

from .trace import Ref, Trace, view

#: aten ops (without their trailing "_") that draw from the default generator even where
#: their overload has no `generator` argument
_RANDOM = {
    "bernoulli",
    "cauchy",
    "exponential",
    "geometric",
    "log_normal",
    "multinomial",
    "native_dropout",
    "normal",
    "poisson",
    "rand",
    "rand_like",
    "randint",
    "randint_like",
    "randn",
    "randn_like",
    "random",
    "randperm",
    "rrelu_with_noise",
    "uniform",
}

State = tuple[torch.Tensor, "list[torch.Tensor] | None"]


def draws(func: Any) -> bool:
    """Whether an aten op draws random numbers."""
    schema = getattr(func, "_schema", None)
    if schema is None:
        return False
    if any(a.name == "generator" for a in schema.arguments):
        return True
    return schema.name.split("::")[-1].rstrip("_") in _RANDOM


def _now(cuda: bool) -> State:
    return torch.random.get_rng_state(), torch.cuda.get_rng_state_all() if cuda else None


def generator_states(trace: Trace) -> dict[int, State]:
    """{op index: the default generators' (cpu, cuda) state just before it} for every
    random op of the record, as eager construction had them (computed once per trace)."""
    return _walk(trace)[0]


def state_after(trace: Trace) -> State:
    """The default generators' state eager construction left them in (after the
    record's last random op), from the same walk."""
    return _walk(trace)[1]


def _walk(trace: Trace) -> tuple[dict[int, State], State]:
    cached = getattr(trace, "_generator_states", None)
    if cached is not None and cached[0] == len(trace.ops):
        return cached[1], cached[2]
    cuda = trace.cuda_rng is not None
    before = _now(cuda)
    states: dict[int, State] = {}
    scratch = _Scratch(trace)
    torch.random.set_rng_state(trace.cpu_rng)
    if cuda:
        torch.cuda.set_rng_state_all(trace.cuda_rng)
    try:
        with torch.no_grad():
            for i, op in enumerate(trace.ops):
                if draws(op.func):
                    states[i] = _now(cuda)
                    scratch.draw(op)
        end = _now(cuda)
    finally:
        torch.random.set_rng_state(before[0])
        if before[1] is not None:
            torch.cuda.set_rng_state_all(before[1])
    trace._generator_states = (len(trace.ops), states, end)
    return states, end


class _Scratch:
    """Runs random ops on scratch storage shaped as their traced arguments' (values
    thrown away), so the generators advance as in eager construction. The first traced
    argument (the tensor a draw fills) reuses one buffer per device, grown to the
    largest: a new one per op would leave the freed ones scattered in the host's heap
    between the small generator states kept meanwhile, and the process's resident
    memory would grow by a model's worth (glibc reuses a hole only when it fits)."""

    def __init__(self, trace: Trace) -> None:
        self.trace = trace
        self.filled: dict[torch.device, torch.Tensor] = {}

    def _buffer(self, a: Ref, first: bool) -> torch.Tensor:
        nbytes = self.trace.storages[a.key].nbytes()
        device = self.trace.devices.get(a.key, torch.device("cpu"))
        if not first:  # an input whose values a draw reads (bernoulli's p): zeros
            return torch.zeros(nbytes, dtype=torch.uint8, device=device)
        buf = self.filled.get(device)
        if buf is None or buf.numel() < nbytes:
            self.filled.pop(device, None)
            buf = self.filled[device] = torch.empty(nbytes, dtype=torch.uint8, device=device)
        return buf

    def draw(self, op: Any) -> None:
        seen: dict[int, torch.Tensor] = {}

        def resolve(a: Any) -> Any:
            if not isinstance(a, Ref):
                return a
            if a.key not in seen:
                seen[a.key] = self._buffer(a, first=not seen)
            return view(seen[a.key], a)

        args, kwargs = tree_map(resolve, op.args)
        if op.factory_device is not None:
            kwargs = {**kwargs, "device": op.factory_device}
        op.func(*args, **kwargs)
