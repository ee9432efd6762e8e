"""A lazily built model sharded for tensor parallelism without being materialised whole.

    shard_lazily(model, device, shard)   # shard(): the policy's in-place sharding

HybridParallelPlugin(tp_size > 1) calls it on a LazyInitContext model (with or without
peft adapters) instead of materialising the model first. While shard() runs, every
torch function that reads a lazy tensor (the policy's detach, narrow, clone of a base
weight) gets its real value instead, computed from the record for that tensor alone
(with the generator states eager construction had: random_ops.py) and dropped once the
policy has taken its shard (the last two are kept, for a weight and its bias read in
turn). The lazy Parameter itself stays on the meta device, so no rank holds more of the
full model than those two tensors beside its shards. What shard() left lazy (layer
norms, replicated biases and heads, buffers: what every rank keeps whole anyway) is
then materialised in place from the ops it needs (chunks.ChunkMaterializer). The values
are eager construction's under the same seed, bit for bit.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_map

from .chunks import ChunkMaterializer
from .context import _trace_of
from .random_ops import generator_states
from .trace import ref_of, storage_key, view

#: writes by operator (the other in-place ops end in "_")
_IN_PLACE = frozenset(
    {"__set__", "__setitem__", "__iadd__", "__isub__", "__imul__", "__itruediv__",
     "__ifloordiv__", "__imod__", "__ipow__", "__iand__", "__ior__", "__ixor__",
     "__ilshift__", "__irshift__", "__imatmul__"}
)  # fmt: skip
#: how many real values are kept for tensors read again (a weight's detach, then its bias')
_CACHED = 2


def shard_lazily(module: torch.nn.Module, device: torch.device, shard: Callable[[], object]):
    """Runs shard() on the lazily built module, each lazy tensor real only while it is
    read, then makes what is still lazy real on device, in place."""
    source = ChunkMaterializer(module, device)  # buffers real now
    try:
        with _RealOnRead():
            shard()
        source([p for p in module.parameters() if p.is_meta])
    finally:
        source.close()


class _RealOnRead(TorchFunctionMode):
    """Lazy tensors read by a torch function are replaced, for that call, by their real
    values (computed apart, never put back into the tensor: writes to it are refused).
    Attribute reads pass through: .shape is metadata, and .data or .T give lazy aliases
    whose values are computed when something reads them."""

    def __init__(self) -> None:
        super().__init__()
        self._real: dict[int, torch.Tensor] = {}  # storage key -> its real storage

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        if name == "__get__":  # metadata, or a lazy alias (.data, .T): read when used
            return func(*args, **kwargs)
        lazy = [t for t in _tensor_args(args, kwargs) if _trace_of(t) is not None]
        if not lazy:
            return func(*args, **kwargs)
        if name in _IN_PLACE or (name.endswith("_") and not name.startswith("__")):
            if name != "requires_grad_":
                raise ValueError(
                    f"{name} writes to a LazyInitContext tensor while HybridParallelPlugin "
                    "shards it: a policy that changes base weights in place cannot shard a "
                    "lazy model; call LazyInitContext.materialize(model) before boost"
                )
            return func(*args, **kwargs)

        def real(a):
            if isinstance(a, torch.Tensor) and _trace_of(a) is not None:
                return view(self._storage(a), ref_of(a))
            return a

        return func(*tree_map(real, args), **tree_map(real, kwargs))

    def _storage(self, t: torch.Tensor) -> torch.Tensor:
        key = storage_key(t)
        if key not in self._real:
            trace = _trace_of(t)
            real = trace.replay({key}, sliced=True, states=generator_states(trace))
            while len(self._real) >= _CACHED:
                self._real.pop(next(iter(self._real)))
            self._real[key] = real[key]
        return self._real[key]


def _tensor_args(args: tuple, kwargs: dict) -> list[torch.Tensor]:
    found: list[torch.Tensor] = []

    def take(a):
        if isinstance(a, torch.Tensor) and a.is_meta:
            found.append(a)
        return a

    tree_map(take, (args, kwargs))
    return found
