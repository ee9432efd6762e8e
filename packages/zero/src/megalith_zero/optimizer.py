"""ZeroOptimizer: backward, clipping, loss scaling and the fused step on this rank's shards."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
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
        self.scaler = DynamicLossScaler(config.loss_scale) if config.fp16 else None
        self._clip_coef = 1.0
        self._stats: tuple[float, bool, list[bool]] | None = None
        self.skipped_steps = 0

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
        over all ranks, in one all-reduce."""
        if self._stats is not None:
            return self._stats
        self.reducer.wait()
        sum_sq, bad = 0.0, False
        by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
        for c in self.trainable:
            by_dtype.setdefault(c.shard_grad.dtype, []).append(c.shard_grad)
        for grads in by_dtype.values():
            if grads[0].is_cuda:
                s = torch.stack([g.float().pow(2).sum() for g in grads]).sum()
                sum_sq += float(s)
                bad = bad or not math.isfinite(float(s))
            else:
                s, b = F.grad_stats(grads)
                sum_sq, bad = sum_sq + s, bad or b
        used = [u for c in self.trainable for u in c.used]
        vec = torch.tensor([sum_sq, float(bad), *map(float, used)], dtype=torch.float64)
        if self.trainable and self.trainable[0].shard_grad.is_cuda:
            vec = vec.to(self.trainable[0].shard_grad.device)
        comm.all_reduce(vec, op="sum", group=self.group)
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

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.reducer.wait()
        for c in self.trainable:
            c.zero_grad()
        self._stats = None
