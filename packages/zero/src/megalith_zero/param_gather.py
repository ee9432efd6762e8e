"""Stages 1 and 2 with ZeroConfig(overlap_param_gather=True): the parameter all-gathers
that follow a step are waited for by the modules that use them, not by the step.

[Note: deferred parameter gathers]
After a step every rank all-gathers the updated shards into everyone's full
parameters. Waited for in step(), that transfer sits between the step and the next
forward with nothing to hide it. Deferred, step() only starts the gathers (in chunk
order, the order forward needs them) and a forward pre-hook on each module that owns
parameters waits for its chunks just before the module runs, so the first layers
compute while the last layers' parameters are still arriving. When the model's
forward returns, every gather still pending is waited for, so backward and anything
after the forward see whole parameters.

The window this leaves: inside the next forward, a parameter read before its owning
module runs (a weight used functionally by another module first) can see the values
before the step. That is why the switch is opt-in, as ColossalAI's overlap_allgather
is. Code that reads parameters between step() and the next forward (an EMA of the
weights, a checkpoint load) calls ZeroModel.wait_params() first; megalith_zero's own
checkpoint loaders do.

With shard_each_param the gathers go a bucket at a time ([Note: coalesced per-parameter
shards] in buckets.py): a module waits for the whole bucket that holds its parameters,
and every bucket's gathered copy is held until its wait (at most the model's working
parameters once more, between step() and the end of the next forward).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

import torch

import megalith_comm as comm

from .buckets import gather_units, start_gather
from .chunk import FlatChunk

#: gathers left running in the plain (not deferred) path; older ones are finished first
MAX_IN_FLIGHT = 2


class _Gather:
    """One all-gather in flight: its handle, its input (alive until waited for) and the
    copies that follow the wait."""

    def __init__(self, handle: comm.Handle, source: torch.Tensor, then: Callable[[], None] | None):
        self.handle, self.source, self.then = handle, source, then
        self.done = False

    def wait(self) -> None:
        if not self.done:
            self.handle.wait()
            if self.then is not None:
                self.then()
            self.done, self.source = True, None


def gather_params(
    chunks: list[FlatChunk], group: comm.ProcessGroup, deferred: DeferredGathers | None = None
) -> None:
    """Every rank's updated shard of `chunks` into everyone's `full` (stages 1, 2), a
    bucket at a time with shard_each_param. deferred: leave the waits to the modules."""
    running: list[_Gather] = []
    for unit in gather_units(chunks):
        gather = _Gather(*start_gather(unit, group))
        if deferred is not None:
            deferred.add([c.spec.index for c in unit], gather)
            continue
        running.append(gather)
        while len(running) > MAX_IN_FLIGHT:
            running.pop(0).wait()
    for gather in running:
        gather.wait()


class DeferredGathers:
    def __init__(self, module: torch.nn.Module, param_chunk: dict[int, int]):
        """param_chunk: id(parameter) -> index of the chunk that holds it."""
        # chunk index -> the gather that fills it (one for all chunks of a bucket)
        self._pending: dict[int, _Gather] = {}
        self._hooks = []
        for mod in module.modules():
            own = [p for p in mod._parameters.values() if p is not None]
            mine = sorted({param_chunk[id(p)] for p in own if id(p) in param_chunk})
            if mine:
                self._hooks.append(mod.register_forward_pre_hook(self._waiter(mine)))

    def _waiter(self, ks: list[int]) -> Callable[..., None]:
        # held weakly: the hook lives on the user's module (see GradReducer._hook)
        me = weakref.ref(self)

        def before_forward(module: torch.nn.Module, args: Any) -> None:
            self = me()
            if self is not None and self._pending:
                for k in ks:
                    self.wait(k)

        return before_forward

    def add(self, ks: list[int], gather: _Gather) -> None:
        for k in ks:
            self._pending[k] = gather

    def wait(self, k: int) -> None:
        gather = self._pending.pop(k, None)
        if gather is not None:
            gather.wait()

    def wait_all(self) -> None:
        for k in list(self._pending):
            self.wait(k)

    def remove(self) -> None:
        for h in self._hooks:
            h.remove()
