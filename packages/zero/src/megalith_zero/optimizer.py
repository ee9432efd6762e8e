"""ZeroOptimizer: backward, clipping, loss scaling and the fused step on this rank's shards."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

import megalith_comm as comm
from megalith.optim import functional as F

from .chunk import FlatChunk
from .config import ZeroConfig
from .grads import GradReducer
from .loss_scale import DynamicLossScaler
from .offload import swapped_states
from .rule import Rule


@dataclass(frozen=True)
class ModelParallel:
    """The model-parallel ranks beside the data-parallel group (tensor and pipeline
    parallelism), for the gradient norm and the fp16 overflow check.

    group: the ranks that share this rank's data-parallel coordinate (they hold the
        other tensor-parallel shards and pipeline stages of the same model replica).
    weight(param): how much this rank's copy of a parameter counts in the norm of the
        whole model: 1 for a parameter only this rank holds (a tensor-parallel shard,
        a parameter of this stage only), 0 for a copy another rank of `group` counts
        (a parameter replicated over tp counted on tp rank 0 only; the secondary copy
        of a weight tied across stages). Fractions (1/tp) work too.

    The norm sums the weighted squares over the data-parallel group, then over
    `group`; the inf/nan flag (every gradient, whatever its weight) is reduced over
    both, so an fp16 overflow on any rank skips the step on every rank.
    """

    group: comm.ProcessGroup
    weight: Callable[[torch.nn.Parameter], float]


def _sum_sq(grads: list[torch.Tensor]) -> tuple[float, bool]:
    """(sum of squares, any inf/nan) of flat gradients: the engine's one-pass kernel on CPU."""
    sum_sq, bad = 0.0, False
    by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
    for g in grads:
        by_dtype.setdefault(g.dtype, []).append(g)
    for group in by_dtype.values():
        if group[0].is_cuda:
            s = float(torch.stack([g.float().pow(2).sum() for g in group]).sum())
            sum_sq += s
            bad = bad or not math.isfinite(s)
        else:
            s, b = F.grad_stats(group)
            sum_sq, bad = sum_sq + s, bad or b
    return sum_sq, bad


class ZeroOptimizer:
    """Use like a torch optimizer: backward(loss), optional clip_grad_norm_, step(), zero_grad().

    `param_groups` are the user's optimizer's own (learning rate schedulers may
    change them); the update is the engine's fused kernel on the fp32 shards.
    """

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        rule: Rule,
        chunks: list[FlatChunk],
        reducer: GradReducer,
        group: comm.ProcessGroup,
        gather_group: comm.ProcessGroup,
        config: ZeroConfig,
        offloader: Any = None,
        model_parallel: ModelParallel | None = None,
    ):
        self.offloader = offloader
        self.optimizer = optimizer
        self.rule = rule
        self.chunks = chunks
        self.trainable = [c for c in chunks if c.trainable]
        self.reducer = reducer
        self.group = group
        self.gather_group = gather_group
        self.config = config
        self.scaler = DynamicLossScaler(config.loss_scale) if config.scales_loss else None
        self._clip_coef = 1.0
        self._stats: tuple[float, bool, list[bool]] | None = None
        self.skipped_steps = 0
        self.model_parallel = model_parallel
        self._weighted = self._weighted_pieces(model_parallel)
        #: placement="auto" (megalith_zero.offload.AutoPlacement): its warm-up ends
        #: with the first step
        self.placement: Any = None

    def _weighted_pieces(
        self, mp: ModelParallel | None
    ) -> dict[float, list[tuple[int, int, int]]] | None:
        """Under model parallelism: weight -> (trainable chunk, shard start, length) of
        every parameter segment of this rank's shards; None when every weight is 1
        and there is no model-parallel group (the plain one-call path)."""
        if mp is None:
            return None
        out: dict[float, list[tuple[int, int, int]]] = {}
        for i, c in enumerate(self.trainable):
            for seg in c.spec.segments(c.rank):
                w = float(mp.weight(c.params[c.spec.slots.index(seg.slot)]))
                if not (w >= 0 and math.isfinite(w)):
                    raise ValueError(
                        f"megalith_zero: model_parallel.weight({seg.slot.name}) = {w}; "
                        "expected a finite weight >= 0"
                    )
                out.setdefault(w, []).append((i, seg.shard_start, seg.length))
        if mp.group.size == 1 and set(out) <= {1.0}:
            return None
        return out

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        return self.optimizer.param_groups

    @property
    def loss_scale(self) -> float:
        return self.scaler.scale if self.scaler else 1.0

    # -- backward -------------------------------------------------------------
    def backward(self, loss: torch.Tensor, **kwargs: Any) -> None:
        """loss.backward(), scaled by the loss scale for fp16."""
        (loss * self.scaler.scale if self.scaler else loss).backward(**kwargs)

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Backward passes inside accumulate gradients locally; the first one
        outside reduces everything accumulated (at every stage)."""
        old, self.reducer.sync = self.reducer.sync, False
        try:
            yield
        finally:
            self.reducer.sync = old

    # -- statistics -------------------------------------------------------------
    def _grad_stats(self) -> tuple[float, bool, list[bool]]:
        """(sum of squares of the scaled gradients, any inf/nan, used per parameter),
        over the data-parallel ranks in one all-reduce (and, with model_parallel, the
        first two over the model-parallel group in a second one)."""
        if self._stats is not None:
            return self._stats
        self.reducer.wait()
        if self._weighted is None:
            sum_sq, bad = _sum_sq([c.shard_grad for c in self.trainable])
        else:
            sum_sq, bad = 0.0, False
            for w, pieces in self._weighted.items():
                s, b = _sum_sq([self.trainable[i].shard_grad[a : a + n] for i, a, n in pieces])
                bad = bad or b
                if w:  # an inf in a weight-0 copy is flagged, not added (0 * inf is nan)
                    sum_sq += w * s
        used = [u for c in self.trainable for u in c.used]
        vec = torch.tensor([sum_sq, float(bad), *map(float, used)], dtype=torch.float64)
        if self.trainable and self.trainable[0].shard_grad.is_cuda:
            vec = vec.to(self.trainable[0].shard_grad.device)
        comm.all_reduce(vec, op="sum", group=self.group)
        if self.model_parallel is not None and self.model_parallel.group.size > 1:
            head = vec[:2].clone()  # the norm and the flag span the model too; `used` is ours
            comm.all_reduce(head, op="sum", group=self.model_parallel.group)
            vec[:2] = head
        vec = vec.cpu()
        self._stats = (
            float(vec[0]),
            bool(vec[1] > 0) or not math.isfinite(float(vec[0])),
            [bool(x > 0) for x in vec[2:]],
        )
        return self._stats

    def clip_grad_norm_(self, max_norm: float, norm_type: float = 2.0) -> float:
        """Global L2 norm of the (unscaled) gradients over all shards; the next step()
        multiplies them by min(1, max_norm / (norm + 1e-6)), as torch's clip_grad_norm_."""
        if norm_type != 2.0:
            raise ValueError(
                f"clip_grad_norm_: norm_type={norm_type}; megalith_zero clips by the L2 norm only"
            )
        sum_sq, _, _ = self._grad_stats()
        norm = math.sqrt(sum_sq) / self.loss_scale
        self._clip_coef = min(1.0, max_norm / (norm + 1e-6))
        return norm

    # -- step -------------------------------------------------------------------
    @torch.no_grad()
    def step(self) -> bool:
        """One update of the shards; False when fp16 overflow skipped it."""
        _, bad, used = self._grad_stats()
        if self.scaler is not None:
            scale = self.scaler.scale
            self.scaler.update(bad)
            if bad:
                self.skipped_steps += 1
                self._end_step()
                return False
        else:
            scale = 1.0
        grad_scale = self._clip_coef / scale
        pos = 0
        per_chunk_used = []
        for c in self.trainable:
            per_chunk_used.append(used[pos : pos + len(c.used)])
            pos += len(c.used)
        swapped: list[tuple[FlatChunk, list[bool], dict[str, Any], tuple[str, ...]]] = []
        for gi, group in enumerate(self.optimizer.param_groups):
            names = self.rule.state_names(group)
            mine = [(c, u) for c, u in zip(self.trainable, per_chunk_used) if c.spec.group == gi]
            for tier in ("device", "host"):  # one engine call per tier and step number
                batch = [(c, u) for c, u in mine if c.tier == tier]
                for c, _ in batch:
                    c.ensure_states(names)
                self._apply(group, names, batch, grad_scale)
            swapped += [(c, u, group, names) for c, u in mine if c.tier == "nvme"]
        # NVMe chunks in one stream over all groups, so every read overlaps a step.
        work_of = {id(c): (u, group, names) for c, u, group, names in swapped}
        for c in swapped_states(self.offloader, [(c, n) for c, _, _, n in swapped]):
            u, group, names = work_of[id(c)]
            self._apply(group, names, [(c, u)], grad_scale)
        for c, u in zip(self.trainable, per_chunk_used):
            c.steps = [s + 1 if ui else s for s, ui in zip(c.steps, u)]
        if self.config.stage in (1, 2):
            self._gather_params()
        self._end_step()
        return True

    def _apply(
        self,
        group: dict[str, Any],
        names: tuple[str, ...],
        batch: list[tuple[FlatChunk, list[bool]]],
        grad_scale: float,
    ) -> None:
        """The rule on chunks of one tier: one fused call per step number."""
        work: dict[int, list[tuple[FlatChunk, slice]]] = {}
        for c, u in batch:
            for step, sl, _ in c.step_pieces(u):
                work.setdefault(step, []).append((c, sl))
        for step, pieces in work.items():
            c0 = pieces[0][0]
            grads = [c.shard_grad[sl] for c, sl in pieces]
            copies = back = None
            if c0.master.data_ptr() != c0.shard.data_ptr():  # a separate fp32 master
                copies = [c.shard[sl] for c, sl in pieces]
            if c0.tier != "device" and c0.shard.is_cuda:
                # The host kernel steps host memory: grads come down, params go up.
                grads = [g.to("cpu", non_blocking=False) for g in grads]
                back, copies = copies, [torch.empty_like(x, device="cpu") for x in copies]
            self.rule.apply(
                group,
                step,
                [c.master[sl] for c, sl in pieces],
                grads,
                {n: [c.states[n][sl] for c, sl in pieces] for n in names},
                copies,
                grad_scale,
            )
            if back is not None:
                for dst, src in zip(back, copies):
                    dst.copy_(src, non_blocking=True)

    def close(self) -> None:
        """Waits for offload transfers and removes the run's swap directory (if any)."""
        if self.offloader is not None:
            self.offloader.close()

    def _gather_params(self, chunks: list[FlatChunk] | None = None) -> None:
        """Stages 1, 2: every rank's updated shard into everyone's full params."""
        handles = []
        for c in self.trainable if chunks is None else chunks:
            mine = c.shard.clone()  # the shard is a view of full, the all-gather's output
            handles.append(comm.all_gather(c.full, mine, group=self.gather_group, async_op=True))
        for h in handles:
            h.wait()

    def _end_step(self) -> None:
        self._stats = None
        self._clip_coef = 1.0
        if self.placement is not None and self.placement.pending:
            self.placement.finish(self.group, self.optimizer, self.rule)

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.reducer.wait()
        for c in self.trainable:
            c.zero_grad()
        self._stats = None
