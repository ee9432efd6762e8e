"""EngineState: the optimizer state of megalith.jax, in host buffers the engine updates.

JAX arrays are immutable and the engine's kernels update in place, so the state is not
a tree of JAX arrays: it is one Python object (a pytree with no leaves, so ``jax.jit``
treats it as a constant and returns it as it came) holding, per parameter leaf, the
fp32 master and the moments in engine buffers, the parameter in its own dtype for
leaves that are not fp32, and the step count. Tools that walk the leaves of an optax
state (orbax, ``jax.tree.map``) see nothing: save it with :func:`save_state` and
restore it with :func:`load_state` (safetensors, atomic).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np

from megalith_core import _engine
from megalith_core.atomic_files import atomic_path

from .host import FlatHost

FORMAT = "megalith.jax/1"


@jax.tree_util.register_pytree_node_class
class EngineState:
    """State of one megalith.jax optimizer over one parameter tree (see the module doc)."""

    def __init__(
        self,
        optimizer: str,
        params: Any,
        moments: tuple[str, ...],
        resource: _engine.memory.Resource,
    ):
        flat, self.treedef = jax.tree_util.tree_flatten_with_path(params)
        self.optimizer = optimizer
        self.names = [jax.tree_util.keystr(path) or "." for path, _ in flat]
        leaves = [leaf for _, leaf in flat]
        self.shapes = [tuple(np.shape(x)) for x in leaves]
        self.dtypes = [np.dtype(x.dtype) for x in leaves]
        for name, dtype in zip(self.names, self.dtypes):
            if dtype.name not in ("float32", "bfloat16", "float16"):
                raise TypeError(
                    f"megalith.jax.{optimizer}: parameter {name} is {dtype.name}; the engine "
                    "steps float32, bfloat16 and float16 parameters (leave others out of the "
                    "tree, or use optax for them)"
                )
        self.resource = resource
        f32 = [np.dtype(np.float32)] * len(leaves)
        self.master = FlatHost(resource, self.shapes, f32)
        for i, x in enumerate(leaves):
            self.master[i][...] = np.asarray(x, dtype=np.float32)
        self.moments = {k: FlatHost(resource, self.shapes, f32, zero=True) for k in moments}
        # the parameter as the caller holds it, for leaves kept in another dtype than fp32
        self.low = [i for i, d in enumerate(self.dtypes) if d != np.float32]
        self.copies: dict[int, np.ndarray] = {}
        if self.low:
            held = FlatHost(
                resource, [self.shapes[i] for i in self.low], [self.dtypes[i] for i in self.low]
            )
            for k, i in enumerate(self.low):
                held[k][...] = np.asarray(leaves[i])
                self.copies[i] = held[k]
        self.decay = [True] * len(leaves)  # weight decay per leaf (optax's mask)
        self.steps = 0  # read through `count` from outside: a jitted step may be in flight

    @property
    def count(self) -> int:
        """Steps taken, once every jitted step in flight has run its update."""
        jax.effects_barrier()
        return self.steps

    def tree_flatten(self):
        return (), self

    @classmethod
    def tree_unflatten(cls, aux: EngineState, children: tuple) -> EngineState:
        return aux

    @property
    def nbytes(self) -> int:
        """Bytes of host memory the state holds (master, moments, low-precision copies)."""
        n = self.master.nbytes + sum(m.nbytes for m in self.moments.values())
        return n + sum(c.nbytes for c in self.copies.values())

    def __repr__(self) -> str:
        return (
            f"<megalith.jax {self.optimizer} state: {len(self.names)} leaves, step {self.steps}, "
            f"{self.nbytes / 2**20:.1f} MiB on {self.resource.name}>"
        )


def state_dict(state: EngineState) -> dict[str, np.ndarray]:
    """The state as host arrays (views, not copies): 'count', 'master<leaf>', '<moment><leaf>'.
    Waits for jitted steps in flight first (their update runs in an io_callback)."""
    jax.effects_barrier()
    out = {"count": np.array([state.count], dtype=np.int64)}
    for i, name in enumerate(state.names):
        out["master" + name] = state.master[i]
        for k, flat in state.moments.items():
            out[k + name] = flat[i]
    return out


def save_state(path: str | os.PathLike, state: EngineState) -> None:
    """Writes the state to one safetensors file, atomically (temp file + rename)."""
    from safetensors.numpy import save_file

    meta = {"format": FORMAT, "optimizer": state.optimizer}
    with atomic_path(path) as tmp:
        save_file(state_dict(state), str(tmp), metadata=meta)


def load_state(source: str | os.PathLike | Mapping[str, np.ndarray], state: EngineState) -> None:
    """Fills `state` (from ``init`` on the same parameter tree) from a file of
    :func:`save_state` or a :func:`state_dict`; the bf16/fp16 parameters the caller
    holds must be the ones saved with it (they are bf16(master))."""
    if isinstance(source, Mapping):
        saved, where = dict(source), "the state dict"
    else:
        from safetensors import safe_open

        with safe_open(str(source), framework="numpy") as f:
            meta = f.metadata() or {}
            saved_by = meta.get("optimizer", state.optimizer)
            if saved_by.removeprefix("offloaded_") != state.optimizer.removeprefix("offloaded_"):
                raise ValueError(
                    f"{source} holds a {saved_by} state; this is a {state.optimizer} "
                    f"state: load it into megalith.jax.{saved_by}(...).init(params)"
                )
            saved = {k: f.get_tensor(k) for k in f.keys()}
        where = str(source)
    target = state_dict(state)
    missing = sorted(set(target) - set(saved))
    extra = sorted(set(saved) - set(target))
    if missing or extra:
        raise ValueError(
            f"{where} does not match this parameter tree: missing {missing[:4]}, unexpected "
            f"{extra[:4]}; init the optimizer on the parameters the state was saved with"
        )
    for key, dst in target.items():
        src = np.asarray(saved[key])
        if src.shape != dst.shape or src.dtype != dst.dtype:
            raise ValueError(
                f"{where}: {key} is {src.dtype}{list(src.shape)}, the state expects "
                f"{dst.dtype}{list(dst.shape)}; init the optimizer on the saved model's parameters"
            )
    state.steps = int(np.asarray(saved["count"])[0])
    for key, dst in target.items():
        if key != "count":
            np.copyto(dst, np.asarray(saved[key]))
    for i, copy in state.copies.items():
        copy[...] = state.master[i].astype(copy.dtype)
