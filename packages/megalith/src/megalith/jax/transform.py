"""One optax GradientTransformation over an engine step, shared by adamw, lion, sgd and
offloaded_adamw.

[Note: what is copied] On the CPU:
- gradients go to the kernel without a copy (``np.asarray`` of a CPU JAX array is a
  read-only view of its buffer; the kernel only reads gradients);
- fp32 parameters are copied once into the fp32 master before the step (the kernel
  updates in place and JAX arrays are immutable), so transformations chained after this
  one, or a skipped update, leave nothing stale; ``offloaded_adamw`` never reads the
  parameters and trusts that the caller applied its updates;
- bf16/fp16 parameters are not read: their fp32 master lives in the state and the
  kernel writes the new bf16/fp16 parameter in the same pass;
- the updates (new - old, fp32: [Note: low-precision updates]) are written into a fresh 64-byte-aligned engine
  buffer that JAX adopts without a copy.
[Note: low-precision updates] The updates of bf16/fp16 leaves are fp32: new - old of two
bf16 values is exact in fp32 (a bf16 difference is not, where a parameter crosses zero or
halves: up to several bf16 steps off), and optax.apply_updates adds in fp32 and casts back,
so the caller's parameter is exactly bf16(master) after every step, as the state assumes.

On a GPU, the gradients come down and the updates go up (``jax.device_put`` to the
gradient's sharding): the engine's CUDA kernels are not used for JAX arrays yet.

[Note: under jax.jit] Traced gradients go through ``jax.experimental.io_callback``
(ordered, so it runs exactly once per step, in program order): the callback receives the
gradients (and parameters) as host arrays, steps the state that the jitted function
closed over (the state is a pytree without leaves, so it is a compile-time constant)
and returns the updates, which XLA copies into its own buffers. A jitted step function
is cached per state object: ``init`` once, then call it with the same state.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import jax
import numpy as np
import optax

from megalith_core import _engine

from .host import FlatHost, host_view, to_jax, widen_difference
from .state import EngineState

#: step(group, step_count, lr, weight_decay): one engine call over a group of leaves
StepFn = Callable[["Group", int, float, float], None]


def matching_leaves(tree: Any, treedef: Any, name: str, what: str) -> list:
    """The leaves of `tree`, which must have the structure the optimizer state was made for."""
    leaves, got = jax.tree_util.tree_flatten(tree)
    if got != treedef:
        raise ValueError(
            f"megalith.jax.{name}: the {what} tree does not match the parameters the "
            f"state was made for ({got} vs {treedef}); init on the same tree"
        )
    return leaves


@dataclass
class Group:
    """Leaves stepped by one engine call: one gradient dtype, one decay, one copy dtype."""

    masters: list[np.ndarray]
    grads: list[np.ndarray]
    moments: dict[str, list[np.ndarray]]
    copies: list[np.ndarray] | None


def scalar(value: Any, count: int, what: str) -> float:
    """A hyper-parameter that may be a schedule (called with the step count, as optax does)."""
    v = value(count) if callable(value) else value
    try:
        return float(v)
    except TypeError:
        raise TypeError(
            f"{what}: expected a number or a schedule returning one, got {v!r}"
        ) from None


def decay_flags(mask: Any, params: Any, treedef: Any, n: int, what: str) -> list[bool]:
    """optax's weight-decay mask (a tree, a prefix tree or a callable) as one flag per leaf."""
    if mask is None:
        return [True] * n
    if callable(mask):
        mask = mask(params)
    full = jax.tree_util.tree_map(
        lambda m, sub: jax.tree_util.tree_map(lambda _: bool(m), sub), mask, params
    )
    flags = jax.tree_util.tree_leaves(full)
    if len(flags) != n:
        raise ValueError(
            f"{what}: the mask has {len(flags)} leaves for {n} parameters; give a tree of bools "
            "shaped like the parameters (or a prefix of them)"
        )
    return flags


class EngineTransform:
    """init/update of one optimizer; `rule` runs the engine steps."""

    def __init__(
        self,
        name: str,
        moments: tuple[str, ...],
        rule: StepFn,
        learning_rate: Any,
        weight_decay: Any = 0.0,
        mask: Any = None,
        *,
        resource: Callable[[], _engine.memory.Resource] = _engine.memory.HostResource,
        read_params: bool = True,
        chunk_bytes: int = 0,
    ):
        self.name, self.moments, self.rule = name, moments, rule
        self.learning_rate, self.weight_decay, self.mask = learning_rate, weight_decay, mask
        self.resource = resource()
        # each step's updates (and new bf16 copies) come from a pool over the same memory:
        # a fresh pinned allocation per step would cost more than the step on a GPU host
        self.scratch = _engine.memory.PoolResource(self.resource, 4 << 20)
        self.read_params = read_params
        self.chunk_bytes = chunk_bytes

    # -- optax surface ----------------------------------------------------------------
    def init(self, params: Any) -> EngineState:
        state = EngineState(self.name, params, self.moments, self.resource)
        state.decay = decay_flags(self.mask, params, state.treedef, len(state.names), self.name)
        return state

    def update(self, updates: Any, state: EngineState, params: Any = None, **extra: Any):
        if not isinstance(state, EngineState):
            raise TypeError(
                f"megalith.jax.{self.name}: the state is {type(state).__name__}; pass the "
                f"state this optimizer's init(params) returned"
            )
        grads = self._leaves(updates, state, "gradients")
        p_leaves = None
        if params is not None and self.read_params:
            p_leaves = self._leaves(params, state, "params")
        if any(isinstance(g, jax.core.Tracer) for g in grads) or (
            p_leaves is not None and any(isinstance(p, jax.core.Tracer) for p in p_leaves)
        ):
            return self._traced(grads, p_leaves, state), state
        out = self.step_host(grads, p_leaves, state)
        return state.treedef.unflatten([to_jax(u, g) for u, g in zip(out, grads)]), state

    def transformation(self) -> optax.GradientTransformationExtraArgs:
        return optax.GradientTransformationExtraArgs(self.init, self.update)

    # -- the host step ------------------------------------------------------------------
    def _leaves(self, tree: Any, state: EngineState, what: str) -> list:
        return matching_leaves(tree, state.treedef, self.name, what)

    def step_host(
        self, grads: Sequence[Any], params: Sequence[Any] | None, state: EngineState
    ) -> list[np.ndarray]:
        """Steps the state; returns the updates as host arrays (fresh, aligned)."""
        count = state.steps  # not state.count: its effects barrier would wait on this callback
        lr = scalar(self.learning_rate, count, f"{self.name}: learning_rate")
        wd = scalar(self.weight_decay, count, f"{self.name}: weight_decay")
        for g in grads:  # start every device-to-host copy before the first chunk's step
            if hasattr(g, "copy_to_host_async") and not isinstance(g, np.ndarray):
                g.copy_to_host_async()
        out = FlatHost(self.scratch, state.shapes, [np.dtype(np.float32)] * len(state.shapes))
        for chunk in self._chunks(state):
            self._step_chunk(chunk, grads, params, state, out, count, lr, wd)
        state.steps = count + 1
        return out.arrays

    def _chunks(self, state: EngineState) -> list[list[int]]:
        if self.chunk_bytes <= 0:
            return [list(range(len(state.names)))]
        chunks, cur, size = [], [], 0
        for i, shape in enumerate(state.shapes):
            cur.append(i)
            size += int(np.prod(shape, dtype=np.int64)) * 16  # master, m, v, grad
            if size >= self.chunk_bytes:
                chunks.append(cur)
                cur, size = [], 0
        return chunks + ([cur] if cur else [])

    def _step_chunk(self, idx, grads, params, state, out, count, lr, wd) -> None:
        g_np = {i: host_view(grads[i]) for i in idx}
        new_low = {}
        low = [i for i in idx if i in state.copies]
        if low:
            held = FlatHost(
                self.scratch, [state.shapes[i] for i in low], [state.dtypes[i] for i in low]
            )
            new_low = {i: held[k] for k, i in enumerate(low)}
        old_f32 = {}
        for i in idx:
            if i in state.copies:
                continue
            if params is not None:  # the caller's fp32 parameter is the truth
                old_f32[i] = host_view(params[i])
                np.copyto(state.master[i], old_f32[i])
            else:
                np.copyto(out[i], state.master[i])
                old_f32[i] = out[i]
        groups: dict[tuple, list[int]] = {}
        for i in idx:
            key = (
                g_np[i].dtype.name,
                state.decay[i],
                new_low[i].dtype.name if i in new_low else None,
            )
            groups.setdefault(key, []).append(i)
        for (_, decay, copy_dtype), members in groups.items():
            group = Group(
                masters=[state.master[i] for i in members],
                grads=[g_np[i] for i in members],
                moments={k: [flat[i] for i in members] for k, flat in state.moments.items()},
                copies=[new_low[i] for i in members] if copy_dtype else None,
            )
            self.rule(group, count + 1, lr, wd if decay else 0.0)
        for i in idx:
            if i in new_low:  # see [Note: low-precision updates]
                widen_difference(new_low[i], state.copies[i], out[i])
                state.copies[i] = new_low[i]
            else:
                np.subtract(state.master[i], old_f32[i], out=out[i])

    def _traced(self, grads: list, params: list | None, state: EngineState) -> Any:
        from jax.experimental import io_callback

        shapes = [jax.ShapeDtypeStruct(s, np.float32) for s in state.shapes]

        def host(g, p):
            return self.step_host(g, p, state)

        out = io_callback(host, shapes, grads, params, ordered=True)
        return state.treedef.unflatten(out)
