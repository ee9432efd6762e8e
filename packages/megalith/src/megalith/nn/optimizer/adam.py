"""HybridAdam, CPUAdam and FusedAdam with ColossalAI's constructor signatures, on
megalith.optim's fused Adam (the engine's kernels; torch's state_dict layout).

They are megalith.optim's classes underneath (ZeRO, offload and checkpoints take
them with the same rule), with three differences of ColossalAI's surface:
- the argument order and names of ColossalAI (`model_params`, `bias_correction`
  before `betas`, `adamw_mode=True`);
- CPUAdam and FusedAdam step CPU and CUDA parameters alike (ColossalAI's CPUAdam
  steps both; megalith's engine has both kernels, so FusedAdam does too);
- `nvme_offload_fraction` and `nvme_offload_dir` only move optimizer states out of
  memory: accepted, and ignored with a warning (megalith offloads states through
  the ZeRO plugins instead);
- bf16 and fp16 parameters (and FSDP2's DTensor shards) are stepped as ColossalAI's
  HybridAdam steps them: each value updated in fp32 and stored back in its dtype, the
  states kept in the parameter's dtype (fp32_shadows.py).

All three take megalith's ``state_dtype="fp32"|"bf16"|"int8"`` (lean Adam states:
12, 8 or ~6 bytes per fp32 parameter with its master; see megalith_core.optim.adam)
and ``master_dtype="fp32"|"bf16"``: with "bf16", bf16 parameters are their own masters,
stepped with a bf16 Kahan compensation (state 'param_comp', 2 B) by the engine instead
of through an fp32 shadow: 2 + 2 + 8 / 4 / ~2.03 B per parameter (fp32 / bf16 / int8
states). fp32 parameters with master_dtype="bf16" are refused.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from megalith_core.optim import CPUAdam as _CPUAdam
from megalith_core.optim import FusedAdam as _FusedAdam
from megalith_core.optim import HybridAdam as _HybridAdam

from ._common import ParamsT, warn_ignored
from .fp32_shadows import Fp32Shadows, needs_shadow

# keep_masters=False keeps nothing between steps: one instance serves every optimizer
_SHADOWS = Fp32Shadows(keep_masters=False)

_NVME_WHY = (
    "it only places optimizer states on NVMe and does not change the update; megalith "
    "offloads states through LowLevelZeroPlugin/GeminiPlugin (plugin.set_offload(tier='nvme', "
    "swap_dir=...))"
)

# torch.optim.AdamW's keyword arguments megalith's Adam takes as well, and its own
# state_dtype/seed (lean Adam states, megalith_core.optim.adam)
_TORCH_KEYWORDS = frozenset(
    {
        "amsgrad",
        "maximize",
        "foreach",
        "fused",
        "capturable",
        "differentiable",
        "state_dtype",
        "seed",
        "master_dtype",
    }
)


def _engine_kwargs(
    owner: str,
    nvme_offload_fraction: float,
    nvme_offload_dir: str | None,
    extra: dict[str, Any],
) -> dict[str, Any]:
    if nvme_offload_fraction:
        warn_ignored(owner, f"nvme_offload_fraction={nvme_offload_fraction}", _NVME_WHY)
    if nvme_offload_dir is not None:
        warn_ignored(owner, "nvme_offload_dir", _NVME_WHY)
    kept = {}
    for key, value in extra.items():
        if key in _TORCH_KEYWORDS:
            kept[key] = value
        else:
            warn_ignored(owner, key, "ColossalAI's HybridAdam takes and ignores extra keywords too")
    return kept


class _HalfParams:
    """step() over half-precision or DTensor parameters through fp32 shadows."""

    param_groups: list[dict[str, Any]]

    def step(self, closure: Callable[[], float] | None = None, div_scale: float = -1.0) -> Any:
        groups = self.param_groups
        if not any(p.grad is not None and needs_shadow(p, g) for g in groups for p in g["params"]):
            return super().step(closure, div_scale=div_scale)  # type: ignore[misc]
        loss = None
        if closure is not None:  # the gradients first, then the shadows take them
            with torch.enable_grad():
                loss = closure()
        with _SHADOWS.stepping(self):  # type: ignore[arg-type]
            super().step(None, div_scale=div_scale)  # type: ignore[misc]
        return loss


class CPUAdam(_HalfParams, _CPUAdam):
    """ColossalAI's CPUAdam(model_params, lr, bias_correction, betas, eps, weight_decay,
    adamw_mode, nvme_offload_fraction, nvme_offload_dir): Adam/AdamW stepping CPU
    parameters with the engine's SIMD kernel and CUDA parameters with its CUDA kernel."""

    devices = frozenset({"cpu", "cuda"})

    def __init__(
        self,
        model_params: ParamsT,
        lr: float = 1e-3,
        bias_correction: bool = True,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        adamw_mode: bool = True,
        nvme_offload_fraction: float = 0.0,
        nvme_offload_dir: str | None = None,
        *,
        state_dtype: str = "fp32",
        master_dtype: str = "fp32",
    ) -> None:
        _engine_kwargs(type(self).__name__, nvme_offload_fraction, nvme_offload_dir, {})
        super().__init__(
            model_params,
            lr=lr,
            betas=betas,
            eps=eps,
            weight_decay=weight_decay,
            adamw_mode=adamw_mode,
            bias_correction=bias_correction,
            state_dtype=state_dtype,
            master_dtype=master_dtype,
        )


class HybridAdam(_HalfParams, _HybridAdam):
    """ColossalAI's HybridAdam(model_params, lr, bias_correction, betas, eps, weight_decay,
    adamw_mode, nvme_offload_fraction, nvme_offload_dir, **defaults): CPU parameters
    through the SIMD kernel, CUDA parameters through one multi-tensor launch.

    Of `**defaults`, torch.optim.AdamW's keywords megalith's Adam has (amsgrad, maximize)
    are honoured; any other is ignored with a warning, as ColossalAI ignores them all."""

    def __init__(
        self,
        model_params: ParamsT,
        lr: float = 1e-3,
        bias_correction: bool = True,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        adamw_mode: bool = True,
        nvme_offload_fraction: float = 0.0,
        nvme_offload_dir: str | None = None,
        **defaults: Any,
    ) -> None:
        kept = _engine_kwargs(
            type(self).__name__, nvme_offload_fraction, nvme_offload_dir, defaults
        )
        super().__init__(
            model_params,
            lr=lr,
            betas=betas,
            eps=eps,
            weight_decay=weight_decay,
            adamw_mode=adamw_mode,
            bias_correction=bias_correction,
            **kept,
        )


class FusedAdam(_HalfParams, _FusedAdam):
    """ColossalAI's FusedAdam(params, lr, bias_correction, betas, eps, adamw_mode,
    weight_decay, amsgrad, set_grad_none). amsgrad=True is honoured (ColossalAI refuses
    it); set_grad_none is zero_grad()'s default."""

    devices = frozenset({"cpu", "cuda"})

    def __init__(
        self,
        params: ParamsT,
        lr: float = 1e-3,
        bias_correction: bool = True,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        adamw_mode: bool = True,
        weight_decay: float = 0.0,
        amsgrad: bool = False,
        set_grad_none: bool = True,
        *,
        state_dtype: str = "fp32",
        master_dtype: str = "fp32",
    ) -> None:
        super().__init__(
            params,
            lr=lr,
            betas=betas,
            eps=eps,
            weight_decay=weight_decay,
            amsgrad=amsgrad,
            adamw_mode=adamw_mode,
            bias_correction=bias_correction,
            state_dtype=state_dtype,
            master_dtype=master_dtype,
        )
        self.set_grad_none = set_grad_none

    def zero_grad(self, set_to_none: bool | None = None) -> None:
        super().zero_grad(set_to_none=self.set_grad_none if set_to_none is None else set_to_none)

    def step(
        self,
        closure: Callable[[], float] | None = None,
        grads: Any = None,
        output_params: Any = None,
        scale: Any = None,
        grad_norms: Any = None,
        div_scale: float = -1.0,
    ) -> Any:
        """One update; div_scale > 0 divides the gradients by it first. grads,
        output_params, scale and grad_norms are apex's retired arguments: refused."""
        if any(a is not None for a in (grads, output_params, scale, grad_norms)):
            raise ValueError(
                "FusedAdam.step: grads/output_params/scale/grad_norms are apex's retired "
                "arguments; call step() with none of them (div_scale undoes a loss scale)"
            )
        return super().step(closure, div_scale=div_scale)
