"""The record of a lazily built model: every tensor op run inside LazyInitContext, in
order, on meta tensors, and its replay on real ones.

[Note: lazy init by record and replay]
Inside the context a TorchDispatchMode sees every aten op. A factory (an op with no
tensor argument: empty, zeros, rand, arange, ...) runs on the meta device instead of
the one asked for, so it allocates nothing; any op on a meta tensor the trace made
(nn.init's uniform_, normal_, zero_, fill_, copy_, a slice's zero_, a .to(dtype)...)
runs on meta too. Each is recorded with its arguments, tensors named by their storage
(a view or `.data` alias of a parameter shares it) and the view's dtype, size, stride
and offset. Materialising replays the record from the start on the devices asked for,
with the random generators set to their state at the context's entry: the random ops
run in the order, and with the generator states, of eager construction, so the values
are eager construction's under the same seed. Only the storages the module being
materialised holds are kept; the others are freed after their last use.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map

META = torch.device("meta")


@dataclass(frozen=True)
class Ref:
    """A meta tensor of the trace: its storage and the view of it."""

    key: int
    dtype: torch.dtype
    size: tuple[int, ...]
    stride: tuple[int, ...]
    offset: int


@dataclass
class Op:
    func: Any
    args: Any  # (args, kwargs) with Refs in place of the trace's meta tensors
    created: list[tuple[int, Ref]]  # (index among the outputs, Ref) of new storages
    factory_device: torch.device | None  # a factory's device to replay on


def storage_key(t: torch.Tensor) -> int:
    return t.untyped_storage()._cdata


def ref_of(t: torch.Tensor) -> Ref:
    return Ref(storage_key(t), t.dtype, tuple(t.shape), tuple(t.stride()), t.storage_offset())


def _returns_tensor(func: Any) -> bool:
    schema = getattr(func, "_schema", None)
    return schema is not None and any("Tensor" in str(r.type) for r in schema.returns)


class Trace:
    """What one LazyInitContext recorded."""

    def __init__(self, default_device: torch.device | None) -> None:
        self.default_device = default_device
        self.ops: list[Op] = []
        # The trace's meta storages, held so that their keys (addresses) are never reused.
        self.storages: dict[int, torch.UntypedStorage] = {}
        #: the device each storage is made on at replay (random_ops.py's scratch needs it)
        self.devices: dict[int, torch.device] = {}
        self.cpu_rng = torch.random.get_rng_state()
        self.cuda_rng = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None
        #: the generators' (cpu, cuda) state when the context closed (None while open)
        self.exit_rng: tuple[torch.Tensor, list[torch.Tensor] | None] | None = None

    def knows(self, t: torch.Tensor) -> bool:
        return t.is_meta and storage_key(t) in self.storages

    # -- recording --------------------------------------------------------------
    def record(self, func: Any, args: tuple, kwargs: dict) -> Any:
        flat, _ = tree_flatten((args, kwargs))
        tensors = [a for a in flat if isinstance(a, torch.Tensor)]
        if not any(self.knows(t) for t in tensors) and (tensors or not _returns_tensor(func)):
            return func(*args, **kwargs)  # nothing of the trace: run as it is
        device = None
        if not tensors:  # a factory: on meta now, on its device at replay
            asked = kwargs.get("device")
            device = torch.device(asked) if asked is not None else self.default_device
            device = device or torch.get_default_device()
            kwargs = {**kwargs, "device": META}

        def to_meta(a: Any) -> Any:
            return a.to(META) if isinstance(a, torch.Tensor) and not a.is_meta else a

        out = func(*tree_map(to_meta, args), **tree_map(to_meta, kwargs))

        def as_record(a: Any) -> Any:
            if isinstance(a, torch.Tensor):
                return ref_of(a) if self.knows(a) else a.detach().clone()  # a real argument
            return a

        created = []
        outs, _ = tree_flatten(out)
        for i, t in enumerate(outs):
            if isinstance(t, torch.Tensor) and t.is_meta and storage_key(t) not in self.storages:
                self.storages[storage_key(t)] = t.untyped_storage()
                self.devices[storage_key(t)] = self._device_made(device, tensors, kwargs)
                created.append((i, ref_of(t)))
        self.ops.append(Op(func, tree_map(as_record, (args, kwargs)), created, device))
        return out

    def _device_made(
        self, factory: torch.device | None, tensors: list[torch.Tensor], kwargs: dict
    ) -> torch.device:
        """Where an op's new storage lives at replay: a factory's device, the device a
        copy asks for, else its first traced input's."""
        if factory is not None:
            return factory
        if kwargs.get("device") is not None:
            return torch.device(kwargs["device"])
        keys = [storage_key(t) for t in tensors if self.knows(t)]
        return self.devices.get(keys[0], torch.device("cpu")) if keys else torch.device("cpu")

    def record_clone(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        """Makes dst (a meta tensor of the same shape made outside the context: a deep
        copy of src) a recorded clone of src, replayed with its values."""
        if not self.knows(src) or dst.shape != src.shape or not dst.is_meta:
            raise ValueError("record_clone: src must be this trace's, dst a meta copy of it")
        key = storage_key(dst)
        self.storages[key] = dst.untyped_storage()
        self.devices[key] = self.devices.get(storage_key(src), torch.device("cpu"))
        func = torch.ops.aten.clone.default
        args = ((ref_of(src),), {"memory_format": torch.preserve_format})
        self.ops.append(Op(func, args, [(0, ref_of(dst))], None))

    # -- replay -----------------------------------------------------------------
    def touched(self) -> list[set[int]]:
        """Per op, the storages it reads, writes or creates (computed once)."""
        cached = getattr(self, "_touched", None)
        if cached is None or len(cached) != len(self.ops):
            cached = self._touched = [
                {a.key for a in tree_flatten(op.args)[0] if isinstance(a, Ref)}
                | {r.key for _, r in op.created}
                for op in self.ops
            ]
        return cached

    def needed(self, keep: set[int]) -> list[int]:
        """The indices of the ops the storages in keep depend on: each op that creates or
        touches a needed storage, and so on back through its arguments."""
        want, chosen = set(keep), []
        touched = self.touched()
        for i in range(len(self.ops) - 1, -1, -1):
            if touched[i] & want:
                want |= touched[i]
                chosen.append(i)
        return chosen[::-1]

    def replay(
        self, keep: set[int], sliced: bool = False, states: dict[int, Any] | None = None
    ) -> dict[int, torch.Tensor]:
        """The real storages (each as a 1-D uint8 tensor over it) of the keys in keep, from
        the whole record run again with the generators as they were at the entry.
        sliced: run only the ops keep depends on (Trace.needed): far less work when keep
        is a few buffers, but a random op then draws from another place of the stream
        than in eager construction (only deterministic values stay eager's), unless
        states (random_ops.generator_states: the generators' state before each random
        op, by op index) is given: each random op then draws what it drew in eager
        construction, whatever is left out ([Note: replaying a part of the record])."""
        indices = self.needed(keep) if sliced else range(len(self.ops))
        ops = [self.ops[i] for i in indices]
        at = list(indices)
        last: dict[int, int] = {}
        for i, op in enumerate(ops):
            for a in tree_flatten(op.args)[0]:
                if isinstance(a, Ref):
                    last[a.key] = i
            for _, r in op.created:
                last.setdefault(r.key, i)
        real: dict[int, torch.Tensor] = {}
        cpu, cuda = torch.random.get_rng_state(), None
        torch.random.set_rng_state(self.cpu_rng)
        if self.cuda_rng is not None:
            cuda = torch.cuda.get_rng_state_all()
            torch.cuda.set_rng_state_all(self.cuda_rng)
        try:
            with torch.no_grad():
                for i, op in enumerate(ops):
                    if states is not None and at[i] in states:
                        set_generators(states[at[i]])
                    self._run(op, real)
                    for key in [k for k in real if last.get(k, -1) <= i and k not in keep]:
                        del real[key]
        finally:
            torch.random.set_rng_state(cpu)
            if cuda is not None:
                torch.cuda.set_rng_state_all(cuda)
        return real

    def _run(self, op: Op, real: dict[int, torch.Tensor]) -> None:
        def resolve(a: Any) -> Any:
            return view(real[a.key], a) if isinstance(a, Ref) else a

        args, kwargs = tree_map(resolve, op.args)
        if op.factory_device is not None:
            kwargs = {**kwargs, "device": op.factory_device}
        outs, _ = tree_flatten(op.func(*args, **kwargs))
        for i, _ref in op.created:
            t = outs[i]
            real[_ref.key] = torch.empty(0, dtype=torch.uint8, device=t.device).set_(
                t.untyped_storage()
            )


def set_generators(state: tuple[torch.Tensor, list[torch.Tensor] | None]) -> None:
    """The default generators to a (cpu, cuda or None) state of random_ops.py."""
    torch.random.set_rng_state(state[0])
    if state[1] is not None:
        torch.cuda.set_rng_state_all(state[1])


def view(storage: torch.Tensor, r: Ref) -> torch.Tensor:
    """The tensor r describes, over a real storage."""
    out = torch.empty(0, dtype=r.dtype, device=storage.device)
    return out.set_(storage.untyped_storage(), r.offset, r.size, r.stride)


class Recorder(TorchDispatchMode):
    """Sends every op to its Trace."""

    def __init__(self, trace: Trace) -> None:
        super().__init__()
        self.trace = trace

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: Any = None):
        return self.trace.record(func, args, kwargs or {})
