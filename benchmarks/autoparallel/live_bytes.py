"""Peak memory of a CPU rank, honestly: the bytes of live tensor storages that torch ops
allocated (a TorchDispatchMode that sees every op's fresh outputs and a weak reference
per storage that says when it is freed), plus the engine arena's own accounting for the
training state megalith keeps outside torch's allocator (ZeRO's flat chunks).

A CPU rank has no caching allocator and no max_memory_allocated; resident set size
counts the interpreter, torch's libraries and freed-but-kept heap pages too. This counts
what the cost model counts: tensors. An op's output that aliases an input (a view, an
in-place or out= op, per the op's schema, or an output in an input's storage, as a
collective's given buffer) allocates nothing and is not counted, so the
engine's buffers, which reach torch through DLPack, are never counted twice; a counted
storage that an op resizes (stage 3's gathered chunks) is re-measured at each op.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves


class LiveBytes(TorchDispatchMode):
    """Counts live torch-allocated storages; `current`, `peak` in bytes, `reset_peak()`."""

    def __init__(self) -> None:
        super().__init__()
        self._sizes: dict[int, int] = {}
        self._refs: dict[int, weakref.ref] = {}
        self.current = 0
        self.peak = 0

    def reset_peak(self) -> None:
        self.peak = self.current

    def _freed(self, key: int) -> None:
        self.current -= self._sizes.pop(key, 0)
        self._refs.pop(key, None)

    def _track(self, t: torch.Tensor, fresh: bool) -> None:
        if t.device.type != "cpu" or t.is_meta:
            return
        st = t.untyped_storage()
        key = id(st)
        if key in self._sizes:  # a storage already counted, perhaps resized in place
            n = st.nbytes()
            self.current += n - self._sizes[key]
            self._sizes[key] = n
        elif fresh:
            self._sizes[key] = st.nbytes()
            self.current += self._sizes[key]
            self._refs[key] = weakref.ref(st, lambda _, k=key: self._freed(k))
        self.peak = max(self.peak, self.current)

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None):
        out = func(*args, **(kwargs or {}))
        inputs = {
            id(t.untyped_storage())
            for t in tree_leaves((args, kwargs))
            if isinstance(t, torch.Tensor) and t.device.type != "meta"
        }
        returns = func._schema.returns
        outs = out if isinstance(out, (tuple, list)) else (out,)
        for i, o in enumerate(outs):
            aliased = i < len(returns) and returns[i].alias_info is not None
            for t in tree_leaves(o):
                if isinstance(t, torch.Tensor):
                    # an output in an input's storage (a collective's given buffer) is not new
                    fresh = not aliased and id(t.untyped_storage()) not in inputs
                    self._track(t, fresh=fresh)
        return out


def engine_reports(model: Any, optimizer: Any) -> list[Any]:
    """Every StateMemory arena the boosted model and optimizer hold (ZeRO's chunks)."""
    found: dict[int, Any] = {}
    zmodel = getattr(model, "module", None)
    if hasattr(zmodel, "memory"):
        found[id(zmodel.memory)] = zmodel.memory
    inner = getattr(optimizer, "optim", None)
    for chunk in getattr(inner, "chunks", None) or getattr(optimizer, "chunks", None) or ():
        mem = getattr(chunk, "memory", None)
        if mem is not None:
            found[id(mem)] = mem
    return list(found.values())


def engine_device_bytes(arenas: list[Any], *, peak: bool) -> dict[str, int]:
    """Device-side bytes by kind over the arenas ("gathered" left out: those storages are
    torch's and LiveBytes counts them)."""
    out: dict[str, int] = {}
    for mem in arenas:
        for kind, usage in mem.report().items():
            if "@" in kind or kind == "gathered":
                continue
            out[kind] = out.get(kind, 0) + (usage.peak_bytes if peak else usage.current_bytes)
    return out
