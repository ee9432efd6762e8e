"""EngineState: the optimizer state of megalith.jax, in host buffers the engine updates.

JAX arrays are immutable and the engine's kernels update in place, so the state is not
a tree of JAX arrays: it is one Python object (a pytree with no leaves, so ``jax.jit``
treats it as a constant and returns it as it came) holding, per parameter leaf, the
fp32 master and the moments in engine buffers, the parameter in its own dtype for
leaves that are not fp32, and the step count. Tools that walk the leaves of an optax
state (orbax, ``jax.tree.map``) see nothing: save it with :func:`save_state` and
restore it with :func:`load_state` (safetensors, atomic). The same functions take the
state of ``zero1_adamw`` (megalith/jax/zero1_checkpoint.py).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import jax
import numpy as np

from megalith_core import _engine
from megalith_core.atomic_files import atomic_path

from .host import FlatHost

if TYPE_CHECKING:
    from .zero1 import Zero1State

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


def _is_zero1(state: object) -> bool:
    from .zero1 import Zero1State  # here: zero1 imports this module

    return isinstance(state, Zero1State)


def rule_of(optimizer: str) -> str:
    """The update rule an optimizer's state belongs to: adamw, offloaded_adamw and
    zero1_adamw keep the same state (master, mu, nu), so their files load into each other."""
    return optimizer.removeprefix("offloaded_").removeprefix("zero1_")


def state_dict(state: EngineState | Zero1State) -> dict[str, np.ndarray]:
    """The state as host arrays: 'count', 'master<leaf>', '<moment><leaf>'. Of an
    :class:`EngineState`, views (not copies), after the jitted steps in flight have run
    (their update runs in an io_callback). Of a ``zero1_adamw`` state, the whole state
    gathered from the ranks on every rank: collective, every rank of its group calls it."""
    if _is_zero1(state):
        from .zero1_checkpoint import gathered_state_dict

        return gathered_state_dict(state)
    jax.effects_barrier()
    out = {"count": np.array([state.count], dtype=np.int64)}
    for i, name in enumerate(state.names):
        out["master" + name] = state.master[i]
        for k, flat in state.moments.items():
            out[k + name] = flat[i]
    return out


def save_state(path: str | os.PathLike, state: EngineState | Zero1State) -> None:
    """Writes the state to one safetensors file, atomically (temp file + rename).
    A ``zero1_adamw`` state is gathered and written whole by the group's first rank
    (collective: every rank calls it), so it loads at any world size and into adamw."""
    if _is_zero1(state):
        from .zero1_checkpoint import save_zero1

        save_zero1(path, state)
        return
    from safetensors.numpy import save_file

    meta = {"format": FORMAT, "optimizer": state.optimizer}
    with atomic_path(path) as tmp:
        save_file(state_dict(state), str(tmp), metadata=meta)


_DTYPES = {"F16": "float16", "BF16": "bfloat16", "F32": "float32", "F64": "float64"}
_DTYPES |= {"I32": "int32", "I64": "int64"}


class SavedState:
    """A saved state, from a file of :func:`save_state` (read one tensor at a time) or a
    :func:`state_dict`: `specs` maps each key to its (shape, dtype name)."""

    def __init__(self, source: str | os.PathLike | Mapping[str, np.ndarray], optimizer: str):
        self.optimizer = optimizer
        if isinstance(source, Mapping):
            self.where, self.file = "the state dict", None
            self.arrays = {k: np.asarray(v) for k, v in source.items()}
            self.specs = {k: (tuple(a.shape), a.dtype.name) for k, a in self.arrays.items()}
            return
        from safetensors import safe_open

        self.where = str(source)
        self.file = safe_open(self.where, framework="numpy")
        saved_by = (self.file.metadata() or {}).get("optimizer", optimizer)
        if rule_of(saved_by) != rule_of(optimizer):
            raise ValueError(
                f"{source} holds a {saved_by} state; this is a {optimizer} "
                f"state: load it into megalith.jax.{saved_by}(...).init(params)"
            )
        self.specs = {}
        for k in self.file.keys():
            piece = self.file.get_slice(k)
            dtype = piece.get_dtype()
            self.specs[k] = (tuple(piece.get_shape()), _DTYPES.get(dtype, dtype))

    def get(self, key: str) -> np.ndarray:
        return self.arrays[key] if self.file is None else self.file.get_tensor(key)

    def flat_range(self, key: str, lo: int, hi: int) -> np.ndarray:
        """Elements [lo, hi) of `key` flattened in C order; from a file, only the rows
        that hold them are read."""
        shape = self.specs[key][0]
        if self.file is None or len(shape) == 0:
            return np.asarray(self.get(key)).reshape(-1)[lo:hi]
        row = int(np.prod(shape[1:], dtype=np.int64))
        first, last = lo // row, -(-hi // row)
        rows = self.file.get_slice(key)[first:last].reshape(-1)
        return rows[lo - first * row : hi - first * row]

    def check(self, expected: Mapping[str, tuple[tuple[int, ...], str]]) -> None:
        """Refuses a state saved for another parameter tree, naming the first differences."""
        missing = sorted(set(expected) - set(self.specs))
        extra = sorted(set(self.specs) - set(expected))
        if missing or extra:
            raise ValueError(
                f"{self.where} does not match this optimizer and parameter tree: missing "
                f"{missing[:4]}, unexpected {extra[:4]}; init the optimizer the state was saved "
                "from (sgd: with the same momentum) on the parameters it was saved with"
            )
        for key, (shape, dtype) in expected.items():
            got_shape, got_dtype = self.specs[key]
            if got_shape != shape or got_dtype != dtype:
                raise ValueError(
                    f"{self.where}: {key} is {got_dtype}{list(got_shape)}, the state expects "
                    f"{dtype}{list(shape)}; init the optimizer on the saved model's parameters"
                )

    def count(self) -> int:
        return int(np.asarray(self.get("count"))[0])


def load_state(
    source: str | os.PathLike | Mapping[str, np.ndarray], state: EngineState | Zero1State
) -> None:
    """Fills `state` (from ``init`` on the same parameter tree) from a file of
    :func:`save_state` or a :func:`state_dict`; the bf16/fp16 parameters the caller
    holds must be the ones saved with it (they are bf16(master)). A ``zero1_adamw``
    state takes its shard of the saved whole state, at any world size: collective,
    every rank of its group calls it with a file (or dict) it can read."""
    if _is_zero1(state):
        from .zero1_checkpoint import load_zero1

        load_zero1(source, state)
        return
    saved = SavedState(source, state.optimizer)
    target = state_dict(state)
    saved.check({k: (tuple(v.shape), v.dtype.name) for k, v in target.items()})
    state.steps = saved.count()
    for key, dst in target.items():
        if key != "count":
            np.copyto(dst, saved.get(key))
    for i, copy in state.copies.items():
        copy[...] = state.master[i].astype(copy.dtype)
