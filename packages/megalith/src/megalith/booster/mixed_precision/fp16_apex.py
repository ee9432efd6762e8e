"""FP16ApexMixedPrecision: apex.amp's arguments, run as torch autocast + dynamic loss scale.

opt_level "O1" (apex's default: fp16 autocast with fp32 weights and a dynamic loss
scale) is what megalith runs, with apex's scale rules (start 2**16, x2 after 2000
clean steps, /2 on overflow, at most max_loss_scale, at least min_loss_scale). "O0"
is fp32. O2/O3 (fp16 weights) and the options that override a level change the
numbers in ways megalith does not reproduce, so they are refused, naming what to
use instead; verbosity only changes apex's printing and is ignored.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch

from megalith_core.loss_scale import LossScaleConfig

from .base import MixedPrecision

_OVERRIDES = (
    "cast_model_type",
    "patch_torch_functions",
    "keep_batchnorm_fp32",
    "master_weights",
    "cast_model_outputs",
)


class FP16ApexMixedPrecision(MixedPrecision):
    def __init__(
        self,
        opt_level: str | None = "O1",
        cast_model_type: torch.dtype | None = None,
        patch_torch_functions: bool | None = None,
        keep_batchnorm_fp32: bool | str | None = None,
        master_weights: bool | None = None,
        loss_scale: float | str | None = None,
        cast_model_outputs: Any = None,
        num_losses: int | None = 1,
        verbosity: int = 1,
        min_loss_scale: float | None = None,
        max_loss_scale: float = 2.0**24,
    ) -> None:
        if opt_level not in ("O0", "O1", None):
            raise NotImplementedError(
                f"FP16ApexMixedPrecision(opt_level={opt_level!r}): fp16 weights (O2/O3) are not "
                "run by megalith's apex stand-in; use opt_level='O1', or fp16 weights with "
                "fp32 masters through LowLevelZeroPlugin(precision='fp16')"
            )
        given = {
            n: v
            for n, v in zip(
                _OVERRIDES,
                (
                    cast_model_type,
                    patch_torch_functions,
                    keep_batchnorm_fp32,
                    master_weights,
                    cast_model_outputs,
                ),
            )
            if v is not None
        }
        if given:
            raise NotImplementedError(
                f"FP16ApexMixedPrecision: {', '.join(f'{k}={v!r}' for k, v in given.items())} "
                "override apex's opt level, which megalith does not reproduce; leave them "
                "None (O1: fp16 autocast, fp32 weights)"
            )
        if num_losses not in (1, None):
            raise NotImplementedError(
                f"FP16ApexMixedPrecision(num_losses={num_losses}): one loss scale per loss is "
                "not supported; leave num_losses=1 (one scale shared by every backward)"
            )
        if isinstance(loss_scale, (int, float)) and not isinstance(loss_scale, bool):
            raise NotImplementedError(
                f"FP16ApexMixedPrecision(loss_scale={loss_scale}): a static loss scale is not "
                "supported; pass loss_scale='dynamic' (or None), or "
                f"FP16TorchMixedPrecision(init_scale={loss_scale})"
            )
        if loss_scale not in (None, "dynamic"):
            raise ValueError(
                f"FP16ApexMixedPrecision(loss_scale={loss_scale!r}): expected None or 'dynamic'"
            )
        if verbosity != 1:
            warnings.warn(
                f"FP16ApexMixedPrecision(verbosity={verbosity}) is ignored: megalith prints "
                "nothing about loss scaling",
                stacklevel=2,
            )
        self.opt_level = opt_level or "O1"
        if self.opt_level == "O0":
            self.precision, self.loss_scale = "fp32", None
            return
        self.precision = "fp16"
        self.loss_scale = LossScaleConfig(
            initial=min(2.0**16, float(max_loss_scale)),
            growth=2.0,
            backoff=0.5,
            growth_interval=2000,
            min_scale=float(min_loss_scale) if min_loss_scale is not None else 2.0**-126,
            max_scale=float(max_loss_scale),
            hysteresis=1,
        )
