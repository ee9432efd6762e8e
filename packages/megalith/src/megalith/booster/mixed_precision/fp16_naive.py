"""FP16NaiveMixedPrecision: fp16 with ColossalAI's naive-AMP loss-scale arguments.

megalith runs it as fp16 autocast over fp32 weights (the weights are the fp32
masters), with the dynamic loss scale these arguments describe: start at
initial_scale, x growth_factor after growth_interval clean steps (1000, ColossalAI's),
x backoff_factor after `hysteresis` overflowing steps, at most max_scale.
log_num_zeros_in_grad and verbose only add logging and are ignored with a warning.
"""

from __future__ import annotations

import warnings

from megalith.strategy.loss_scale import colossal_loss_scale

from .base import MixedPrecision


class FP16NaiveMixedPrecision(MixedPrecision):
    precision = "fp16"

    def __init__(
        self,
        log_num_zeros_in_grad: bool = False,
        initial_scale: int = 2**16,
        growth_factor: int = 2,
        backoff_factor: float = 0.5,
        hysteresis: int = 2,
        max_scale: int = 2**32,
        verbose: bool | None = None,
    ) -> None:
        for name, value in (("log_num_zeros_in_grad", log_num_zeros_in_grad), ("verbose", verbose)):
            if value:
                warnings.warn(
                    f"FP16NaiveMixedPrecision({name}={value}) is ignored: it only adds logging, "
                    "which megalith does not do",
                    stacklevel=2,
                )
        self.loss_scale = colossal_loss_scale(
            initial_scale=initial_scale,
            growth_factor=growth_factor,
            backoff_factor=backoff_factor,
            hysteresis=hysteresis,
            max_scale=max_scale,
        )
