"""ZeroOptimizer: backward, clipping, loss scaling and the fused step on this rank's shards."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch

import megalith_comm as comm
from megalith_core.loss_scale import DynamicLossScaler
from megalith_core.optim import functional as F
from megalith_core.optim.rules import Rule

from .chunk import FlatChunk
from .config import ZeroConfig
from .grads import GradReducer
from .param_gather import gather_params
from .tiers import ChunkUpdate, Tier


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
        if group[0].is_cuda:  # the engine's fused pass: reads each gradient once
            out = torch.zeros(2, dtype=torch.float32, device=group[0].device)
            F.grad_check(group, out[0:1], out[1:2])  # found_inf, sum of squares
            found, s = out.tolist()  # one host read for both
            sum_sq += s
            bad = bad or found > 0 or not math.isfinite(s)
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
        tiers: Sequence[Tier],
        offloader: Any = None,
        model_parallel: ModelParallel | None = None,
    ):
        """tiers: the objects that update the chunks of each tier, in the order a step
        runs them (megalith_zero.offload.make_tiers); offloader: megalith_offload's
        record of where each chunk is, or None."""
        self.offloader = offloader
        self.optimizer = optimizer
        self.rule = rule
        self.chunks = chunks
        self.trainable = [c for c in chunks if c.trainable]
        self.reducer = reducer
        self.group = group
        self.gather_group = gather_group
        self.config = config
        self.tiers = list(tiers)
        self._tier: dict[str, Any] = {t.name: t for t in self.tiers}
        self.scaler = DynamicLossScaler(config.loss_scale) if config.scales_loss else None
        self._clip_coef = 1.0
        self._stats: tuple[float, bool, list[bool]] | None = None
        self.skipped_steps = 0
        #: called at the start of step(), before any state changes, and with
        #: step_in_backward before each in-backward chunk update (an asynchronous
        #: checkpoint that reads host-resident state in place waits there; a hook meant
        #: to run once removes itself)
        self.step_pre_hooks: list[Callable[[], None]] = []
        self.model_parallel = model_parallel
        self._weighted = self._weighted_pieces(model_parallel)
        #: placement="auto" (megalith_offload.AutoPlacement): its warm-up ends with the
        #: first step
        self.placement: Any = None
        #: overlap_param_gather: the post-step gathers the next forward waits for
        self.deferred: Any = None
        self.step_in_backward = config.step_in_backward
        self._stepped_early: set[int] = set()  # ids of chunks stepped by this backward
        self._synced_at_step = 0  # reducer.synced_backwards when step() last ran
        reducer.on_reduced = self._on_reduced
        if self.step_in_backward:
            reducer.on_backward_start = self._check_backward_start

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

    def reduced_grads(self, params: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """Views of these parameters' reduced gradients (averaged over the data-parallel
        group), in the chunks' gradient buffers, valid after a synchronised backward and
        until step(). Stage 1 only, where every rank keeps a parameter's whole reduced
        gradient; editing a view changes what step() applies (a pipeline sums a weight
        tied across stages here)."""
        where = {id(p): (c, i) for c in self.trainable for i, p in enumerate(c.params)}
        out = []
        for p in params:
            if id(p) not in where:
                raise ValueError("megalith_zero.reduced_grads: a parameter this optimizer lacks")
            c, i = where[id(p)]
            if c.stage != 1 or c.full_grad is None:
                raise ValueError(
                    f"megalith_zero.reduced_grads: stage {c.stage} keeps only a shard of each "
                    "reduced gradient; use stage 1"
                )
            if self.step_in_backward:
                raise ValueError(
                    "megalith_zero.reduced_grads: step_in_backward=True has already applied "
                    "the gradients in backward; turn it off"
                )
            slot = c.spec.slots[i]
            out.append(c.full_grad[slot.offset : slot.offset + slot.numel].view(p.shape))
        self.reducer.wait()
        return out

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
    def _grad_stats(self, norm: bool = True) -> tuple[float, bool, list[bool]]:
        """(sum of squares of the scaled gradients, any inf/nan, used per parameter),
        over the data-parallel ranks in one all-reduce (and, with model_parallel, the
        first two over the model-parallel group in a second one). norm=False: only the
        used flags (0.0 and False for the others), for a step that neither clips nor
        scales; every rank of the group must ask for the same."""
        if self._stats is not None:
            return self._stats
        self.reducer.wait()
        if not norm:
            sum_sq, bad = 0.0, False
        elif self._weighted is None:
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

    def clip_grad_norm_(
        self, max_norm: float, norm_type: float = 2.0, extra_sum_sq: float = 0.0
    ) -> float:
        """Global L2 norm of the (unscaled) gradients over all shards; the next step()
        multiplies them by min(1, max_norm / (norm + 1e-6)), as torch's clip_grad_norm_.
        extra_sum_sq: the squared (unscaled) norm of the model's gradients another
        optimizer steps (shard(outside=...)), the same on every rank: the norm returned and
        clipped by is the whole model's, the caller scaling those gradients itself."""
        if self._updated_in_backward:
            raise RuntimeError(
                "clip_grad_norm_: the chunks were already updated during backward "
                "(ZeroConfig(step_in_backward=True)), so their gradients can no longer be "
                "clipped; set step_in_backward=False to clip"
            )
        if norm_type != 2.0:
            raise ValueError(
                f"clip_grad_norm_: norm_type={norm_type}; megalith_zero clips by the L2 norm only"
            )
        sum_sq, _, _ = self._grad_stats()
        norm = math.sqrt(sum_sq) / self.loss_scale
        if extra_sum_sq:
            norm = math.sqrt(norm * norm + extra_sum_sq)
        self._clip_coef = min(1.0, max_norm / (norm + 1e-6))
        return norm

    # -- step -------------------------------------------------------------------
    @torch.no_grad()
    def step(self) -> bool:
        """One update of the shards; False when fp16 overflow skipped it."""
        # The update runs here, not in the wrapped optimizer's step(): say it was called,
        # as its step() would, or an LR scheduler built on it warns at its first step that
        # it ran before the optimizer's.
        self.optimizer._opt_called = True
        for hook in list(self.step_pre_hooks):
            hook()
        if self.deferred is not None:  # a step with no forward since the last one
            self.deferred.wait_all()
        _, bad, used = self._grad_stats(norm=self.scaler is not None)
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
        groups = self.optimizer.param_groups
        names = [self.rule.state_names(g) for g in groups]
        work: dict[str, list[ChunkUpdate]] = {t.name: [] for t in self.tiers}
        for c, u in zip(self.trainable, per_chunk_used):
            if id(c) not in self._stepped_early:
                gi = c.spec.group
                work[c.tier].append(ChunkUpdate(c, groups[gi], names[gi], c.step_pieces(u)))
        for tier in self.tiers:
            tier.step(work[tier.name], grad_scale)
        for tier in self.tiers:
            tier.wait()
        for c, u in zip(self.trainable, per_chunk_used):
            c.steps = [s + 1 if ui else s for s, ui in zip(c.steps, u)]
        if self.config.stage in (1, 2):
            self._gather_params(defer=self.deferred is not None)
        self._end_step()
        return True

    # -- a tier's device visits (megalith_offload's host tier: OffloadConfig.visit_frac) ----
    def _visiting_tier(self) -> Any:
        """The tier whose chunks visit the device for their update, or None."""
        return next((t for t in self.tiers if hasattr(t, "visit_frac")), None)

    @property
    def visits(self) -> Any:
        """The visiting tier's DeviceVisits once one of its chunks visited the device."""
        tier = self._visiting_tier()
        return tier.visits if tier is not None else None

    @property
    def visit_frac(self) -> float:
        """The fraction of the visiting tier's chunks the device updates (given or chosen)."""
        tier = self._visiting_tier()
        return tier.visit_frac if tier is not None else 0.0

    @property
    def visit_timing(self) -> tuple[float, float] | None:
        """visit_frac="auto": the (host, link) seconds per parameter behind the choice."""
        tier = self._visiting_tier()
        return tier.visit_timing if tier is not None else None

    @property
    def _updated_in_backward(self) -> bool:
        """A synchronised backward ran since step() with step_in_backward (the same on
        every rank, whichever chunks each one updated early)."""
        return (
            self.step_in_backward
            and self.reducer.synced_backwards > self._synced_at_step
            and any(self._tier[c.tier].steps_in_backward for c in self.trainable)
        )

    def _check_backward_start(self) -> None:
        if self._updated_in_backward:
            raise RuntimeError(
                "megalith_zero: a second backward before step() with "
                "ZeroConfig(step_in_backward=True), which updates each backward's chunks "
                "at once; accumulate gradients inside ZeroOptimizer.no_sync() (through the "
                "Booster: booster.no_sync(model, optimizer)) and call step() after each "
                "synchronised backward, or set step_in_backward=False (GeminiPlugin("
                "enable_gradient_accumulation=True) does)"
            )

    def _on_reduced(self, c: FlatChunk) -> None:
        """With step_in_backward: a chunk whose gradients are complete is updated now,
        while backward goes on (see ZeroConfig.step_in_backward): on the host for host
        chunks, on the step stream for device chunks."""
        if not self.step_in_backward or not c.trainable:
            return
        tier = self._tier[c.tier]
        if not tier.steps_in_backward:
            return
        if self.placement is not None and self.placement.pending:
            return  # the warm-up step measures the plain step first
        own = [c.spec.slots.index(seg.slot) for seg in c.spec.segments(c.rank)]
        if not all(c.used[i] for i in own):
            return  # a parameter unused here: step() decides with every rank's flags
        group = self.optimizer.param_groups[c.spec.group]
        for hook in list(self.step_pre_hooks):
            hook()
        update = ChunkUpdate(c, group, self.rule.state_names(group), c.step_pieces(c.used))
        tier.step([update], 1.0, in_backward=True)
        self._stepped_early.add(id(c))

    def close(self) -> None:
        """Waits for offload transfers and removes the run's swap directory (if any)."""
        for tier in self.tiers:
            tier.close()

    def _gather_params(self, chunks: list[FlatChunk] | None = None, defer: bool = False) -> None:
        """Stages 1, 2: every rank's updated shard into everyone's full params. defer:
        leave the waiting to the modules that use them ([Note: deferred parameter
        gathers] in param_gather.py)."""
        if self.gather_group.size == 1:
            return  # the shard is the whole of `full`: the update already wrote it
        todo = self.trainable if chunks is None else chunks
        gather_params(todo, self.gather_group, self.deferred if defer else None)

    def _end_step(self) -> None:
        self._stepped_early.clear()
        self._synced_at_step = self.reducer.synced_backwards
        self._stats = None
        self._clip_coef = 1.0
        placed = self.placement is None or not self.placement.pending
        if not placed:
            groups = self.optimizer.param_groups
            self.placement.finish(self.group, lambda c: self.rule.state_names(groups[c.spec.group]))
        for tier in self.tiers:
            tier.end_step(placed)

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.reducer.wait()
        if self._updated_in_backward:
            raise RuntimeError(
                "megalith_zero: zero_grad() after a backward that already updated offloaded "
                "chunks (ZeroConfig(step_in_backward=True)); call step() first: every "
                "synchronised backward is a step in this mode"
            )
        for c in self.trainable:
            c.zero_grad()
        self._stats = None
