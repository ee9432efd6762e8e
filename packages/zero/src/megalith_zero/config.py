"""ZeroConfig: what to shard and in which precision, validated before any collective."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from megalith_core.loss_scale import LossScaleConfig

_PRECISIONS = {
    None: None,
    "fp32": None,
    "bf16": torch.bfloat16,
    "fp16": torch.float16,
    torch.float32: None,
    torch.bfloat16: torch.bfloat16,
    torch.float16: torch.float16,
}


def working_dtype(precision: object) -> torch.dtype | None:
    """None for fp32 training, else the dtype the model computes in."""
    try:
        return _PRECISIONS[precision]
    except (KeyError, TypeError):
        raise ValueError(
            f"ZeroConfig: precision={precision!r}; expected 'fp32', 'bf16' or 'fp16' "
            "(or the matching torch dtype)"
        ) from None


@dataclass(frozen=True)
class ZeroConfig:
    """How megalith_zero shards a model's training state over the data-parallel group.

    stage: 1 shards optimizer states (gradients all-reduced, every rank keeps
        full parameters and gradients); 2 also shards gradients (reduce-scattered
        as backward produces them); 3 also shards parameters (gathered per module
        just before use, freed after).
    precision: "fp32", "bf16" or "fp16": the dtype of the working parameters the
        model computes with. The optimizer always updates fp32 master shards.
    reduce_dtype: dtype gradients are reduced in; None means the working dtype.
        "fp32" costs twice the traffic of bf16 and avoids rounding the sum.
    chunk_bytes: target size of a chunk (a group of consecutive parameters that
        is reduced, gathered and stepped as one flat buffer). 0 picks the size that
        wastes the fewest padding bytes (the engine's search) between 1 MiB and an
        eighth of the model (at most 64 MiB, at least the largest parameter). With
        shard_each_param: the size of a bucket (below).
    shard_each_param: every parameter is a chunk of its own, so a rank's shard of every
        parameter is its equal slice (padded to world * 16 elements): ColossalAI's
        LowLevelZero partition. Masters, optimizer states and steps stay per parameter;
        the gradient reductions and the parameter gathers after a step go a bucket of
        consecutive parameters at a time, one collective each (ColossalAI's
        reduce_bucket_size): up to chunk_bytes per bucket (a larger parameter alone;
        chunk_bytes=1: one collective per parameter), or with chunk_bytes=0 the size
        the search picks for chunks of this model. The numbers are bit-identical to one
        collective per parameter at world 2; beyond, a last-bit difference is possible
        ([Note: coalesced per-parameter shards] in buckets.py).
    prefetch: stage 3: how many chunks ahead of the running module are gathered.
    keep_gathered_bytes: stage 3: up to this many bytes of gathered chunks stay gathered
        from their use in forward to their use in backward instead of being freed and
        gathered again (FSDP's reshard_after_forward=False, under a budget). When the
        kept chunks exceed it, the one whose next use is furthest goes first: backward
        runs the forward's order in reverse, so that is the one forward used earliest.
        0: free every chunk after its forward use. With OffloadConfig(placement="auto")
        the room the warm-up leaves after moving states back is added to it.
    loss_scale: fp16 only; see LossScaleConfig.
    loss_scaling: None (the default): dynamic loss scaling exactly when precision is
        fp16. True: also with fp32 working parameters, for a model that computes in fp16
        under torch.autocast while the optimizer holds fp32 (the loss is then scaled by
        whoever runs backward, with ZeroOptimizer.loss_scale).
    overlap: reduce gradients asynchronously while backward continues.
    offload: a megalith_offload.OffloadConfig (needs megalith-offload): which
        chunks keep their fp32 masters and optimizer states in host memory or on
        NVMe, stepped there by the engine's CPU kernel. None: all on the device.
    step_in_backward: update each chunk as soon as backward has reduced its
        gradients, while backward goes on: device chunks on a side stream (on CUDA),
        host chunks on the host; step() then only finishes. The numbers are the same
        (a chunk's update needs nothing from the others) as long as nothing clips or
        scales: clip_grad_norm_ then raises, fp16 loss scaling is refused, NVMe chunks
        still step in step(), and every synchronised backward is a step (accumulate
        inside no_sync()). The Booster's ZeRO plugins turn it on for offloaded runs
        that neither clip nor scale.
    overlap_param_gather: stages 1 and 2: the parameter all-gathers after a step are
        waited for by each module just before it runs in the next forward, not by
        step(), so they overlap the forward (ColossalAI's overlap_allgather). A
        parameter read before its module runs, or between step() and the next
        forward, needs ZeroModel.wait_params() first (see param_gather.py).
    """

    stage: int = 2
    precision: str | torch.dtype | None = "fp32"
    reduce_dtype: str | torch.dtype | None = None
    chunk_bytes: int = 0
    shard_each_param: bool = False
    prefetch: int = 1
    keep_gathered_bytes: int = 0
    loss_scale: LossScaleConfig = field(default_factory=LossScaleConfig)
    loss_scaling: bool | None = None
    overlap: bool = True
    offload: Any = None
    step_in_backward: bool = False
    overlap_param_gather: bool = False

    def __post_init__(self) -> None:
        if self.stage not in (1, 2, 3):
            raise ValueError(f"ZeroConfig: stage={self.stage!r}; expected 1, 2 or 3")
        working_dtype(self.precision)
        if self.reduce_dtype is not None:
            working_dtype(self.reduce_dtype)
        if self.chunk_bytes < 0:
            raise ValueError(
                f"ZeroConfig: chunk_bytes={self.chunk_bytes}; expected >= 0 (0 = search)"
            )
        if self.overlap_param_gather and self.stage == 3:
            raise ValueError(
                "ZeroConfig: overlap_param_gather=True at stage 3, which already gathers each "
                "module's parameters just before it runs; use it with stage 1 or 2"
            )
        if self.prefetch < 0:
            raise ValueError(f"ZeroConfig: prefetch={self.prefetch}; expected >= 0")
        if self.keep_gathered_bytes < 0:
            raise ValueError(
                f"ZeroConfig: keep_gathered_bytes={self.keep_gathered_bytes}; expected >= 0"
            )
        if self.keep_gathered_bytes and self.stage != 3:
            raise ValueError(
                f"ZeroConfig: keep_gathered_bytes={self.keep_gathered_bytes} at stage "
                f"{self.stage}; only stage 3 frees parameters after forward: use stage=3 "
                "or keep_gathered_bytes=0"
            )
        if self.offload is not None and not (
            hasattr(self.offload, "tier") and hasattr(self.offload, "optim_frac")
        ):
            raise ValueError(
                f"ZeroConfig: offload={self.offload!r}; expected None or a "
                "megalith_offload.OffloadConfig (e.g. OffloadConfig(tier='host'))"
            )

    @property
    def param_dtype(self) -> torch.dtype:
        return working_dtype(self.precision) or torch.float32

    @property
    def grad_reduce_dtype(self) -> torch.dtype:
        if self.reduce_dtype is None:
            return self.param_dtype
        return working_dtype(self.reduce_dtype) or torch.float32

    @property
    def fp16(self) -> bool:
        return self.param_dtype == torch.float16

    @property
    def scales_loss(self) -> bool:
        return self.fp16 if self.loss_scaling is None else bool(self.loss_scaling)
