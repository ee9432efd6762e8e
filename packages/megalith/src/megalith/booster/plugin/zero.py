"""LowLevelZeroPlugin (ZeRO stage 1/2) and GeminiPlugin (stage 3) on megalith_zero.

Arguments keep ColossalAI's names and defaults where they mean the same thing.
Composition order (one place, fixed): model to the rank's device -> megalith_zero.shard
(working params in the chosen precision on chunk memory, fp32 master shards, gradient
reduction hooks, stage-3 gather hooks) -> the wrappers the Booster hands back.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any

import torch

from ..wrappers import ModelWrapper, OptimizerWrapper
from .base import Plugin, check_precision, require, world

if TYPE_CHECKING:
    from ..checkpoint_io import CheckpointIO


class ZeroModelWrapper(ModelWrapper):
    pass


class ZeroOptimizerWrapper(OptimizerWrapper):
    def __init__(self, zopt: Any, max_norm: float):
        super().__init__(zopt)
        self.max_norm = max_norm
        self._clipped = False

    def backward(self, loss: torch.Tensor, *args: Any, **kwargs: Any) -> None:
        self.optim.backward(loss, *args, **kwargs)

    def clip_grad_by_norm(self, max_norm: float, norm_type: float = 2.0) -> float:
        self._clipped = True
        return self.optim.clip_grad_norm_(max_norm, norm_type)

    def step(self, *args: Any, **kwargs: Any) -> Any:
        if self.max_norm > 0 and not self._clipped:
            self.optim.clip_grad_norm_(self.max_norm)
        self._clipped = False
        return self.optim.step()

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.optim.zero_grad()

    def no_sync(self):
        return self.optim.no_sync()

    @property
    def loss_scale(self) -> float:
        return self.optim.loss_scale


class _ZeroPlugin(Plugin):
    stage = 2

    def _setup(
        self,
        precision: str,
        max_norm: float,
        loss_scale: dict[str, Any],
        chunk_bytes: int,
        reduce_dtype: Any,
        overlap: bool,
    ) -> None:
        self.precision = check_precision(type(self).__name__, precision)
        self.max_norm = max_norm
        self._loss_scale = loss_scale
        self._chunk_bytes = chunk_bytes
        self._reduce_dtype = reduce_dtype
        self._overlap = overlap
        self._offload: Any = None  # a megalith_offload.OffloadConfig, or None
        self._overlap_gather = False  # LowLevelZeroPlugin(overlap_allgather=True)
        self._step_in_backward: bool | None = None  # None: when nothing clips or scales

    def set_offload(self, step_in_backward: bool | None = None, **kwargs: Any) -> None:
        """Offloads optimizer states: kwargs of megalith_offload.OffloadConfig (tier,
        optim_frac, swap_dir, ...), validated now so bad numbers fail here.
        step_in_backward (megalith_zero.ZeroConfig's): None updates chunks during
        backward whenever the plugin neither clips (max_norm 0) nor scales the loss
        (precision not fp16)."""
        mo = require("megalith_offload", "megalith-offload", type(self).__name__ + " offloading")
        self._offload = mo.OffloadConfig(**kwargs)
        self._step_in_backward = step_in_backward

    def _updates_in_backward(self) -> bool:
        if self._step_in_backward is not None:
            return self._step_in_backward
        return self._offload is not None and not self.max_norm and self.precision != "fp16"

    def set_precision(self, precision: str | None) -> None:
        if precision is not None:
            self.precision = check_precision(type(self).__name__, precision)

    def zero_config(self) -> Any:
        zero = require("megalith_zero", "megalith-zero", type(self).__name__)
        return zero.ZeroConfig(
            stage=self.stage,
            precision=self.precision,
            reduce_dtype=self._reduce_dtype,
            chunk_bytes=self._chunk_bytes,
            loss_scale=zero.LossScaleConfig(**self._loss_scale),
            overlap=self._overlap,
            offload=self._offload,
            step_in_backward=self._updates_in_backward(),
            overlap_param_gather=self._overlap_gather,
        )

    def configure(self, model, optimizer, criterion, dataloader, lr_scheduler):
        zero = require("megalith_zero", "megalith-zero", type(self).__name__)
        if optimizer is None:
            raise ValueError(
                f"{type(self).__name__}: boost() needs the optimizer (ZeRO shards its states)"
            )
        w = world()
        model = model.to(w.device)
        zmodel, zopt = zero.shard(model, optimizer, self.zero_config())
        return (
            ZeroModelWrapper(zmodel),
            ZeroOptimizerWrapper(zopt, self.max_norm),
            criterion,
            dataloader,
            lr_scheduler,
        )

    def no_sync(self, model: Any, optimizer: Any) -> contextlib.AbstractContextManager:
        if optimizer is None:
            raise ValueError(
                f"{type(self).__name__}: no_sync needs the boosted optimizer (no_sync(model, optimizer))"
            )
        return optimizer.no_sync()

    def get_checkpoint_io(self) -> CheckpointIO:
        """megalith_zero's full checkpoints, gathered chunk by chunk."""
        from ..checkpoint_io import ZeroCheckpointIO

        return ZeroCheckpointIO()


def _scale_args(
    initial_scale, min_scale, growth_factor, backoff_factor, growth_interval, hysteresis, max_scale
):
    return dict(
        initial=float(initial_scale),
        min_scale=float(min_scale),
        growth=float(growth_factor),
        backoff=float(backoff_factor),
        growth_interval=int(growth_interval),
        hysteresis=int(hysteresis),
        max_scale=float(max_scale),
    )


class LowLevelZeroPlugin(_ZeroPlugin):
    """ZeRO stage 1 or 2 (ColossalAI's arguments). cpu_offload=True keeps every fp32
    master and optimizer state in host memory (megalith-offload), stepped there by the
    engine's CPU kernel. overlap_allgather=True leaves the parameter all-gathers after a
    step to the next forward's modules (megalith_zero's overlap_param_gather)."""

    def __init__(
        self,
        stage: int = 1,
        precision: str = "fp16",
        initial_scale: float = 2**32,
        min_scale: float = 1,
        growth_factor: float = 2,
        backoff_factor: float = 0.5,
        growth_interval: int = 1000,
        hysteresis: int = 2,
        max_scale: float = 2**32,
        max_norm: float = 0.0,
        reduce_bucket_size_in_m: int = 12,
        communication_dtype: torch.dtype | None = None,
        overlap_communication: bool = True,
        cpu_offload: bool = False,
        verbose: bool = False,
        overlap_allgather: bool = False,
    ) -> None:
        super().__init__()
        if stage not in (1, 2):
            raise ValueError(
                f"LowLevelZeroPlugin: stage={stage}; expected 1 or 2 (stage 3 is GeminiPlugin)"
            )
        self.stage = stage
        self._setup(
            precision,
            max_norm,
            _scale_args(
                initial_scale,
                min_scale,
                growth_factor,
                backoff_factor,
                growth_interval,
                hysteresis,
                max_scale,
            ),
            reduce_bucket_size_in_m << 20,
            communication_dtype,
            overlap_communication,
        )
        if cpu_offload:
            self.set_offload(tier="host", optim_frac=1.0)
        self._overlap_gather = overlap_allgather


class GeminiPlugin(_ZeroPlugin):
    """ZeRO stage 3 over chunks (ColossalAI's arguments). offload_optim_frac keeps that
    fraction of the chunks' fp32 masters and optimizer states in host memory
    (megalith-offload). placement_policy="auto": the first step runs with every chunk's
    masters and states on the host while it measures the step's device memory, then
    the chunks that fit under steady_cuda_cap_ratio of the device move back to it
    (megalith_offload's auto placement; on CPU ranks give the simulated device's size
    with set_offload(placement="auto", device_budget_bytes=...)). offload_param_frac keeps
    that fraction of the chunks' parameter shards in host memory (at most
    offload_optim_frac: the host kernel writes them)."""

    stage = 3

    def __init__(
        self,
        placement_policy: str = "static",
        shard_param_frac: float = 1.0,
        offload_optim_frac: float = 0.0,
        offload_param_frac: float = 0.0,
        precision: str = "fp16",
        initial_scale: float = 2**16,
        min_scale: float = 1,
        growth_factor: float = 2,
        backoff_factor: float = 0.5,
        growth_interval: int = 1000,
        hysteresis: int = 2,
        max_scale: float = 2**32,
        max_norm: float = 0.0,
        chunk_init_device: Any = None,
        chunk_config_dict: dict | None = None,
        pin_memory: bool = False,
        verbose: bool = False,
        steady_cuda_cap_ratio: float = 0.9,
    ) -> None:
        super().__init__()
        if placement_policy not in ("static", "auto"):
            raise ValueError(
                f"GeminiPlugin: placement_policy={placement_policy!r}; expected 'static' or 'auto'"
            )
        if not 0.0 < steady_cuda_cap_ratio <= 1.0:
            raise ValueError(
                f"GeminiPlugin: steady_cuda_cap_ratio={steady_cuda_cap_ratio}; the fraction of "
                "the device's memory auto placement may fill, in (0, 1]"
            )
        if shard_param_frac != 1.0:
            raise NotImplementedError(
                f"GeminiPlugin: shard_param_frac={shard_param_frac}; megalith shards all parameters at stage 3 "
                "(use 1.0, or LowLevelZeroPlugin to keep parameters whole)"
            )
        chunk_bytes = int((chunk_config_dict or {}).get("chunk_size", 0))
        self._setup(
            precision,
            max_norm,
            _scale_args(
                initial_scale,
                min_scale,
                growth_factor,
                backoff_factor,
                growth_interval,
                hysteresis,
                max_scale,
            ),
            chunk_bytes,
            None,
            True,
        )
        if placement_policy == "auto":
            if offload_optim_frac:
                raise ValueError(
                    f"GeminiPlugin: offload_optim_frac={offload_optim_frac} with "
                    "placement_policy='auto'; auto placement decides the fraction itself "
                    "(leave offload_optim_frac at 0.0, or use placement_policy='static')"
                )
            if offload_param_frac:
                raise ValueError(
                    f"GeminiPlugin: offload_param_frac={offload_param_frac} with "
                    "placement_policy='auto'; auto placement decides which parameter "
                    "shards leave the GPU itself (leave offload_param_frac at 0.0, or use "
                    "placement_policy='static' to choose it)"
                )
            self.set_offload(
                tier="host", optim_frac=1.0, placement="auto", headroom=1.0 - steady_cuda_cap_ratio
            )
        elif offload_optim_frac or offload_param_frac:
            if offload_param_frac > offload_optim_frac:
                raise ValueError(
                    f"GeminiPlugin: offload_param_frac={offload_param_frac} > offload_optim_frac="
                    f"{offload_optim_frac}; a chunk's parameters can live in host memory only "
                    "where its optimizer states do (the host kernel writes them): raise "
                    "offload_optim_frac to at least offload_param_frac"
                )
            self.set_offload(
                tier="host", optim_frac=offload_optim_frac, param_frac=offload_param_frac
            )
