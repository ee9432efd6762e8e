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

from megalith.strategy import Strategy, ZeroTuning, colossal_loss_scale

from ..wrappers import ModelWrapper, OptimizerWrapper
from .base import StrategyPlugin, check_precision, require, world

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


class _ZeroPlugin(StrategyPlugin):
    @property
    def stage(self) -> int:
        return self.strategy.zero_stage

    @property
    def _offload(self) -> Any:
        """The megalith_offload.OffloadConfig, or None."""
        return self.strategy.offload

    def set_offload(self, step_in_backward: bool | None = None, **kwargs: Any) -> None:
        """Offloads optimizer states: kwargs of megalith_offload.OffloadConfig (tier,
        optim_frac, swap_dir, ...), validated now so bad numbers fail here.
        step_in_backward (megalith_zero.ZeroConfig's): None updates chunks during
        backward whenever the plugin neither clips (max_norm 0) nor scales the loss
        (precision not fp16)."""
        self.strategy = self.strategy.replace(
            offload=_offload_config(type(self).__name__, **kwargs),
            step_in_backward=step_in_backward,
        )

    def zero_config(self) -> Any:
        return self.strategy.zero_config()

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


def _offload_config(owner: str, **kwargs: Any) -> Any:
    mo = require("megalith_offload", "megalith-offload", owner + " offloading")
    return mo.OffloadConfig(**kwargs)


class LowLevelZeroPlugin(_ZeroPlugin):
    """ZeRO stage 1 or 2 (ColossalAI's arguments). cpu_offload=True keeps every fp32
    master and optimizer state in host memory (megalith-offload), stepped there by the
    engine's CPU kernel. overlap_allgather=True leaves the parameter all-gathers after a
    step to the next forward's modules (megalith_zero's overlap_param_gather)."""

    runs = ("zero1", "zero2")

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
        if stage not in (1, 2):
            raise ValueError(
                f"LowLevelZeroPlugin: stage={stage}; expected 1 or 2 (stage 3 is GeminiPlugin)"
            )
        offload = None
        if cpu_offload:
            offload = _offload_config("LowLevelZeroPlugin", tier="host", optim_frac=1.0)
        super().__init__(
            Strategy(
                plugin=f"zero{stage}",
                precision=check_precision("LowLevelZeroPlugin", precision),
                offload=offload,
                loss_scale=colossal_loss_scale(
                    initial_scale=initial_scale,
                    min_scale=min_scale,
                    growth_factor=growth_factor,
                    backoff_factor=backoff_factor,
                    growth_interval=growth_interval,
                    hysteresis=hysteresis,
                    max_scale=max_scale,
                ),
                max_norm=max_norm,
                zero=ZeroTuning(
                    chunk_bytes=reduce_bucket_size_in_m << 20,
                    reduce_dtype=communication_dtype,
                    overlap=overlap_communication,
                    overlap_param_gather=overlap_allgather,
                ),
            )
        )


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

    runs = ("gemini",)

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
        offload = None
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
            offload = _offload_config(
                "GeminiPlugin",
                tier="host",
                optim_frac=1.0,
                placement="auto",
                headroom=1.0 - steady_cuda_cap_ratio,
            )
        elif offload_optim_frac or offload_param_frac:
            if offload_param_frac > offload_optim_frac:
                raise ValueError(
                    f"GeminiPlugin: offload_param_frac={offload_param_frac} > offload_optim_frac="
                    f"{offload_optim_frac}; a chunk's parameters can live in host memory only "
                    "where its optimizer states do (the host kernel writes them): raise "
                    "offload_optim_frac to at least offload_param_frac"
                )
            offload = _offload_config(
                "GeminiPlugin",
                tier="host",
                optim_frac=offload_optim_frac,
                param_frac=offload_param_frac,
            )
        super().__init__(
            Strategy(
                plugin="gemini",
                precision=check_precision("GeminiPlugin", precision),
                offload=offload,
                loss_scale=colossal_loss_scale(
                    initial_scale=initial_scale,
                    min_scale=min_scale,
                    growth_factor=growth_factor,
                    backoff_factor=backoff_factor,
                    growth_interval=growth_interval,
                    hysteresis=hysteresis,
                    max_scale=max_scale,
                ),
                max_norm=max_norm,
                zero=ZeroTuning(chunk_bytes=int((chunk_config_dict or {}).get("chunk_size", 0))),
            )
        )
