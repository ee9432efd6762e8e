"""zero1_adamw: data-parallel AdamW with the optimizer state sharded over the ranks (ZeRO-1).

``megalith.jax.zero1_adamw(...)`` takes optax.adamw's arguments (plus ``group``) and
returns an optax ``GradientTransformation`` for a data-parallel loop::

    tx = megalith.jax.zero1_adamw(learning_rate=1e-3, weight_decay=0.01)
    state = tx.init(params)                        # same params on every rank
    for x, y in my_share_of_each_batch:
        grads = jax.grad(loss)(params, x, y)       # this rank's gradients
        updates, state = tx.update(grads, state, params)
        params = optax.apply_updates(params, updates)

The contract:
- Every rank of the group (default: megalith_comm's world; ``megalith_comm.init()``
  first) holds the same parameters, calls ``init(params)`` once and ``update(grads,
  state, params)`` once per step, in the same order: both are collective. ``init``
  checks that the parameters agree (a fingerprint exchange; ``check_replicated=False``
  skips it).
- ``update`` averages the gradients over the ranks (a reduce-scatter, in fp32), steps
  this rank's shard of the flattened parameters with the engine's fused AdamW, and
  all-gathers the updates: every rank returns the same full updates, so the parameters
  stay replicated. With each rank's loss the mean over an equal share of the batch,
  this is optax.adamw on the whole batch, within fp32 rounding.
- Flattening: the leaves in tree order, each in C order, concatenated into N elements;
  rank r owns the n_r = N // size + (r < N % size) elements from sum(n_0..n_{r-1}).
  Shards differ by at most one element; a leaf may straddle ranks.
- The state of a rank is the fp32 master, m and v of its n_r elements only (about
  12 N / size bytes, ``state.nbytes``), in the engine's host memory, plus one fp32
  buffer of N elements the gradients are flattened into for the reduce-scatter.
- fp32 parameters: the caller's parameters are the truth, as in megalith.jax.adamw
  (the shard is copied into the master before each step). bf16/fp16 parameters: the
  fp32 master is the truth and the updates are fp32, new - old exactly, so that
  ``optax.apply_updates`` gives the parameter rounded from the master.
- Under ``jax.jit`` the host step runs in an ordered ``io_callback`` (as in
  megalith/jax/transform.py, [Note: under jax.jit]); every rank must jit the same step.
- GPU arrays come to the host and the collectives run over the group's Gloo group,
  as megalith.jax's other optimizers step on the host (no CUDA kernel for JAX yet).
- ``megalith.jax.save_state`` / ``load_state`` take the state (collective): the first
  rank writes the whole state gathered, in megalith.jax.adamw's format, and every rank
  loads its shard of it, so a checkpoint resumes at any world size, or in adamw
  (megalith/jax/zero1_checkpoint.py).
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Any

import jax
import numpy as np
import optax
import torch

from megalith_core import _engine
from megalith_core.optim import functional as F

from .collectives import group_for
from .host import FlatHost, host_view, to_jax, widen_difference
from .optimizers import _float, _moments_fp32
from .transform import decay_flags, matching_leaves, scalar

NAME = "zero1_adamw"


@dataclass(frozen=True)
class Segment:
    """The part of one leaf in this rank's shard: leaf elements [lo, hi) at shard[at:]."""

    leaf: int
    lo: int
    hi: int
    at: int


def shard_counts(total: int, size: int) -> list[int]:
    """Elements per rank of a flat vector of `total` (the first total % size get one more)."""
    base, extra = divmod(total, size)
    return [base + (r < extra) for r in range(size)]


def segments(sizes: list[int], start: int, stop: int) -> list[Segment]:
    """The pieces of the leaves (of `sizes` elements, concatenated) in [start, stop)."""
    out, offset = [], 0
    for i, n in enumerate(sizes):
        lo, hi = max(start, offset), min(stop, offset + n)
        if lo < hi:
            out.append(Segment(i, lo - offset, hi - offset, lo - start))
        offset += n
    return out


@jax.tree_util.register_pytree_node_class
class Zero1State:
    """One rank's shard of the AdamW state (see the module doc); a pytree without leaves."""

    def __init__(self, params: Any, group: Any, resource: _engine.memory.Resource):
        with_paths, self.treedef = jax.tree_util.tree_flatten_with_path(params)
        flat = [leaf for _, leaf in with_paths]
        # the leaves' names as megalith.jax.adamw's state has them: the saved files agree
        self.names = [jax.tree_util.keystr(path) or "." for path, _ in with_paths]
        self.optimizer = NAME
        self.shapes = [tuple(np.shape(x)) for x in flat]
        self.dtypes = [np.dtype(x.dtype) for x in flat]
        for i, dtype in enumerate(self.dtypes):
            if dtype.name not in ("float32", "bfloat16", "float16"):
                raise TypeError(
                    f"megalith.jax.{NAME}: parameter leaf {i} is {dtype.name}; the engine steps "
                    "float32, bfloat16 and float16 parameters (leave others out of the tree)"
                )
        self.sizes = [int(np.prod(s, dtype=np.int64)) for s in self.shapes]
        self.total = sum(self.sizes)
        self.group = group
        self.counts = shard_counts(self.total, group.size)
        start = sum(self.counts[: group.rank])
        self.segments = segments(self.sizes, start, start + self.counts[group.rank])
        n = self.counts[group.rank]
        f32 = [np.dtype(np.float32)]
        self.master = FlatHost(resource, [(n,)], f32)[0]
        self.mu = FlatHost(resource, [(n,)], f32, zero=True)[0]
        self.nu = FlatHost(resource, [(n,)], f32, zero=True)[0]
        for s in self.segments:
            self.master[s.at : s.at + s.hi - s.lo] = host_view(flat[s.leaf]).reshape(-1)[
                s.lo : s.hi
            ]
        self.flat_grads = np.empty(self.total, np.float32)  # reduce-scatter's input
        self.grad_shard = self.flat_grads if group.size == 1 else np.empty(n, np.float32)
        self.decay = [True] * len(flat)
        self.steps = 0

    @property
    def count(self) -> int:
        """Steps taken, once every jitted step in flight has run its update."""
        jax.effects_barrier()
        return self.steps

    @property
    def nbytes(self) -> int:
        """Bytes of this rank's optimizer state: its shard of the master, m and v."""
        return 3 * self.master.nbytes

    def tree_flatten(self):
        return (), self

    @classmethod
    def tree_unflatten(cls, aux: Zero1State, children: tuple) -> Zero1State:
        return aux

    def __repr__(self) -> str:
        return (
            f"<megalith.jax {NAME} state: rank {self.group.rank} of {self.group.size}, "
            f"{self.counts[self.group.rank]} of {self.total} elements, step {self.steps}>"
        )


def _fingerprint(leaves: list[Any]) -> int:
    crc = 0
    for x in leaves:
        a = host_view(x)
        crc = zlib.crc32(str((a.shape, a.dtype.name)).encode(), crc)
        crc = zlib.crc32(a.reshape(-1).view(np.uint8), crc)
    return crc


def _check_replicated(group: Any, params: Any) -> None:
    import megalith_comm as comm

    mine = torch.tensor([_fingerprint(jax.tree_util.tree_leaves(params))], dtype=torch.int64)
    every = torch.empty(group.size, dtype=torch.int64)
    comm.all_gather(every, mine, group=group)
    prints = every.tolist()
    differ = [group.ranks[i] for i, v in enumerate(prints) if v != prints[0]]
    if differ:
        raise ValueError(
            f"megalith.jax.{NAME}.init: the parameters of rank(s) {differ} differ from rank "
            f"{group.ranks[0]}'s; data parallelism needs the same parameters on every rank: "
            "init them from the same seed (or broadcast rank 0's) before init"
        )


class Zero1AdamW:
    def __init__(self, learning_rate, b1, b2, eps, weight_decay, mask, group, check_replicated):
        self.learning_rate, self.weight_decay, self.mask = learning_rate, weight_decay, mask
        self.betas, self.eps = (_float(b1), _float(b2)), _float(eps)
        self.group_arg, self.check = group, check_replicated
        self.resource = _engine.memory.HostResource()

    def init(self, params: Any) -> Zero1State:
        group = group_for(f"{NAME}.init", self.group_arg)
        if self.check and group.size > 1:
            _check_replicated(group, params)
        state = Zero1State(params, group, self.resource)
        state.decay = decay_flags(self.mask, params, state.treedef, len(state.sizes), NAME)
        return state

    def update(self, updates: Any, state: Zero1State, params: Any = None, **extra: Any):
        if not isinstance(state, Zero1State):
            raise TypeError(
                f"megalith.jax.{NAME}: the state is {type(state).__name__}; pass the state this "
                "optimizer's init(params) returned"
            )
        if params is None:
            raise ValueError(
                f"megalith.jax.{NAME}: update needs the parameters: tx.update(grads, state, params)"
            )
        grads, p_leaves = (
            self._leaves(updates, state, "gradients"),
            self._leaves(params, state, "params"),
        )
        if any(isinstance(x, jax.core.Tracer) for x in grads + p_leaves):
            from jax.experimental import io_callback

            shapes = [jax.ShapeDtypeStruct(s, np.float32) for s in state.shapes]
            out = io_callback(
                lambda g, p: self.step_host(g, p, state), shapes, grads, p_leaves, ordered=True
            )
            return state.treedef.unflatten(out), state
        out = self.step_host(grads, p_leaves, state)
        return state.treedef.unflatten([to_jax(u, g) for u, g in zip(out, grads)]), state

    def _leaves(self, tree: Any, state: Zero1State, what: str) -> list:
        return matching_leaves(tree, state.treedef, NAME, what)

    def step_host(self, grads: list, params: list, state: Zero1State) -> list[np.ndarray]:
        """One collective step; returns every leaf's fp32 update as a host array."""
        import megalith_comm as comm

        g, count = state.group, state.steps
        lr = scalar(self.learning_rate, count, f"{NAME}: learning_rate")
        wd = scalar(self.weight_decay, count, f"{NAME}: weight_decay")
        for x in grads:  # start every device-to-host copy before the first is needed
            if hasattr(x, "copy_to_host_async") and not isinstance(x, np.ndarray):
                x.copy_to_host_async()
        offset = 0
        for x, n in zip(grads, state.sizes):
            np.copyto(state.flat_grads[offset : offset + n], host_view(x).reshape(-1))
            offset += n
        even = len(set(state.counts)) == 1
        if g.size > 1:  # one rank: the flat gradients are the shard
            send, shard = torch.from_numpy(state.flat_grads), torch.from_numpy(state.grad_shard)
            comm.reduce_scatter(
                shard, send if even else list(torch.split(send, state.counts)), op="avg", group=g
            )
        # fresh each step: JAX may adopt the updates' memory without a copy
        update_shard = np.empty_like(state.grad_shard)
        self._step_shard(params, state, count + 1, lr, wd, update_shard)
        state.steps = count + 1
        updates = update_shard
        if g.size > 1:
            updates = np.empty(state.total, np.float32)
            out, mine = torch.from_numpy(updates), torch.from_numpy(update_shard)
            comm.all_gather(out if even else list(torch.split(out, state.counts)), mine, group=g)
        leaves, offset = [], 0
        for shape, n in zip(state.shapes, state.sizes):
            leaves.append(updates[offset : offset + n].reshape(shape))
            offset += n
        return leaves

    def _step_shard(self, params, state, step, lr, wd, update_shard) -> None:
        old, new_low, groups = {}, {}, {}
        for s in state.segments:
            span = slice(s.at, s.at + s.hi - s.lo)
            old[s] = host_view(params[s.leaf]).reshape(-1)[s.lo : s.hi]
            if state.dtypes[s.leaf] == np.float32:
                state.master[span] = old[s]  # the caller's fp32 parameter is the truth
            else:
                new_low[s] = np.empty(s.hi - s.lo, state.dtypes[s.leaf])
            key = (state.decay[s.leaf], state.dtypes[s.leaf].name)
            groups.setdefault(key, []).append((s, span))
        for (decay, dtype), members in groups.items():
            F.adam_step(
                [state.master[span] for _, span in members],
                [state.grad_shard[span] for _, span in members],
                [state.mu[span] for _, span in members],
                [state.nu[span] for _, span in members],
                param_copies=None if dtype == "float32" else [new_low[s] for s, _ in members],
                step=step,
                lr=lr,
                betas=self.betas,
                eps=self.eps,
                weight_decay=wd if decay else 0.0,
            )
        for s in state.segments:
            span = slice(s.at, s.at + s.hi - s.lo)
            if s in new_low:  # exact in fp32: see [Note: low-precision updates] in transform.py
                widen_difference(new_low[s], old[s], update_shard[span])
            else:
                np.subtract(state.master[span], old[s], out=update_shard[span])


def zero1_adamw(
    learning_rate: optax.ScalarOrSchedule,
    b1: float = 0.9,
    b2: float = 0.999,
    eps: float = 1e-8,
    eps_root: float = 0.0,
    mu_dtype: Any | None = None,
    weight_decay: optax.ScalarOrSchedule = 1e-4,
    mask: Any | None = None,
    *,
    nesterov: bool = False,
    group: Any = None,
    check_replicated: bool = True,
) -> optax.GradientTransformationExtraArgs:
    """optax.adamw's arguments; the optimizer state sharded over `group` (megalith_comm's
    world when None) and the gradients averaged over it. See the module doc for the contract."""
    if _float(eps_root) != 0.0 or nesterov:
        raise ValueError(
            f"megalith.jax.{NAME}: eps_root and nesterov are not in the engine's fused Adam; "
            "leave eps_root=0.0 and nesterov=False"
        )
    _moments_fp32(mu_dtype, NAME, "mu_dtype")
    tx = Zero1AdamW(learning_rate, b1, b2, eps, weight_decay, mask, group, check_replicated)
    return optax.GradientTransformationExtraArgs(tx.init, tx.update)
