"""Adam/AdamW on the engine's fused kernels: CPUAdam, FusedAdam, HybridAdam.

They take torch.optim.AdamW's arguments and ColossalAI's (adamw_mode,
bias_correction, div_scale in step), and keep torch's state_dict layout
(per-parameter 'step', 'exp_avg', 'exp_avg_sq', 'max_exp_avg_sq'), so
checkpoints move between them and torch.optim.Adam/AdamW both ways.

Default weight_decay is 0 as in ColossalAI (torch.optim.AdamW's is 0.01).

``state_dtype`` picks how exp_avg and exp_avg_sq are stored (see
[Note: lean states] in core/include/megalith/optim/slots.h); bytes per
parameter, with the fp32 master (4) and not counting the gradient:

    state_dtype  states                                            total
    "fp32"       fp32 m, v (exact, torch's layout)                 12 B
    "bf16"       bf16 m, v, stochastically rounded                  8 B
    "int8"       int8 m, uint8 v codes + fp32 scale per 256 each  ~6.03 B

state_dict() keeps the chosen format (bf16 tensors, or the int8/uint8 codes
with 'exp_avg_scale'/'exp_avg_sq_scale', and 'state_dtype' in each param
group); load_state_dict() converts any of them (and torch.optim's fp32 states)
into this optimizer's format, so resuming in the same format is bit-identical.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch

from . import lean_states
from ._base import EngineOptimizer, ParamsT, increment_steps, new_step_tensor
from .functional import adam_step


class _EngineAdam(EngineOptimizer):
    def __init__(
        self,
        params: ParamsT,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        amsgrad: bool = False,
        *,
        maximize: bool = False,
        adamw_mode: bool | None = None,
        decoupled_weight_decay: bool | None = None,
        bias_correction: bool = True,
        foreach: bool | None = None,
        fused: bool | None = None,
        capturable: bool = False,
        differentiable: bool = False,
        nvme_offload_fraction: float = 0.0,
        nvme_offload_dir: str | None = None,
        state_dtype: str = "fp32",
        seed: int = 0,
    ) -> None:
        name = type(self).__name__
        lean_states.check_state_dtype(name, state_dtype)
        if amsgrad and state_dtype != "fp32":
            raise ValueError(
                f"{name}: amsgrad needs fp32 states (got state_dtype={state_dtype!r}); "
                "pass state_dtype='fp32' or amsgrad=False"
            )
        if not 0.0 <= lr:
            raise ValueError(f"{name}: invalid learning rate {lr}; expected >= 0")
        if not 0.0 <= eps:
            raise ValueError(f"{name}: invalid eps {eps}; expected >= 0")
        for i, b in enumerate(betas):
            if not 0.0 <= b < 1.0:
                raise ValueError(f"{name}: invalid beta{i + 1} {b}; expected 0 <= beta < 1")
        if weight_decay < 0.0:
            raise ValueError(f"{name}: invalid weight_decay {weight_decay}; expected >= 0")
        if capturable or differentiable:
            raise ValueError(
                f"{name}: capturable/differentiable are not supported; use torch.optim.AdamW for those"
            )
        if nvme_offload_fraction:
            raise NotImplementedError(
                f"{name}: NVMe offload of optimizer states arrives with megalith-offload; "
                "pass nvme_offload_fraction=0.0 for now"
            )
        if (
            adamw_mode is not None
            and decoupled_weight_decay is not None
            and adamw_mode != decoupled_weight_decay
        ):
            raise ValueError(
                f"{name}: adamw_mode={adamw_mode} contradicts decoupled_weight_decay={decoupled_weight_decay}"
            )
        decoupled = (
            self._default_decoupled
            if adamw_mode is None and decoupled_weight_decay is None
            else bool(adamw_mode if adamw_mode is not None else decoupled_weight_decay)
        )
        defaults = dict(
            lr=lr,
            betas=tuple(betas),
            eps=eps,
            weight_decay=weight_decay,
            amsgrad=amsgrad,
            maximize=maximize,
            foreach=None,
            capturable=False,
            differentiable=False,
            fused=None,
            decoupled_weight_decay=decoupled,
            bias_correction=bias_correction,
            state_dtype=state_dtype,
            seed=seed,
        )
        super().__init__(params, defaults)

    _default_decoupled: ClassVar[bool] = True

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        for group in self.param_groups:  # a state dict from torch.optim.Adam/AdamW lacks ours
            group.setdefault("amsgrad", False)
            group.setdefault("maximize", False)
            group.setdefault("bias_correction", True)
            group.setdefault("decoupled_weight_decay", self.defaults["decoupled_weight_decay"])
            group.setdefault("state_dtype", "fp32")
            group.setdefault("seed", 0)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Loads a state dict of any state format into this optimizer's format
        (each param group keeps its state_dtype; see the module doc)."""
        wanted = [g["state_dtype"] for g in self.param_groups]
        super().load_state_dict(state_dict)
        for group, state_dtype in zip(self.param_groups, wanted):
            group["state_dtype"] = state_dtype
            for p in group["params"]:
                state = self.state.get(p)
                if state and "exp_avg" in state:
                    # torch.optim casts every state to the param's dtype on load: bf16
                    # states and int8/uint8 codes arrive as exact fp32 and go back here.
                    lean_states.convert(state, state_dtype)

    def _init_state(self, p: torch.Tensor, state: dict[str, Any], group: dict[str, Any]) -> None:
        state["step"] = new_step_tensor()
        if group["state_dtype"] != "fp32":
            state.update(lean_states.new_states(p, group["state_dtype"]))
            return
        state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        if group["amsgrad"]:
            state["max_exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)

    def _bucket_key(self, state: dict[str, Any]) -> Any:
        return int(state["step"]) + 1

    def _step_bucket(
        self, group: dict[str, Any], params: list[torch.Tensor], step: int, grad_scale: float
    ) -> bool:
        states = [self.state[p] for p in params]
        amsgrad = group["amsgrad"]
        q8 = group["state_dtype"] == "int8"
        if amsgrad:
            for p, s in zip(params, states):
                if "max_exp_avg_sq" not in s:  # amsgrad switched on after the first step
                    s["max_exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        found = adam_step(
            params,
            [p.grad for p in params],
            [s["exp_avg"] for s in states],
            [s["exp_avg_sq"] for s in states],
            max_exp_avg_sqs=[s["max_exp_avg_sq"] for s in states] if amsgrad else None,
            step=step,
            lr=float(group["lr"]),
            betas=group["betas"],
            eps=group["eps"],
            weight_decay=group["weight_decay"],
            decoupled_weight_decay=group["decoupled_weight_decay"],
            amsgrad=amsgrad,
            bias_correction=group["bias_correction"],
            maximize=group["maximize"],
            grad_scale=grad_scale,
            exp_avg_scales=[s["exp_avg_scale"] for s in states] if q8 else None,
            exp_avg_sq_scales=[s["exp_avg_sq_scale"] for s in states] if q8 else None,
            seed=group["seed"],
        )
        increment_steps(states)
        return found


class CPUAdam(_EngineAdam):
    """Adam/AdamW for parameters in host memory: the engine's SIMD kernel on all cores."""

    devices = frozenset({"cpu"})
    other_device_hint = (
        "Use HybridAdam for a mix of CPU and GPU parameters, or FusedAdam on the GPU."
    )


class FusedAdam(_EngineAdam):
    """Adam/AdamW for GPU parameters: one multi-tensor CUDA launch per group."""

    devices = frozenset({"cuda"})
    other_device_hint = "Use CPUAdam for host parameters, or HybridAdam for a mix."


class HybridAdam(_EngineAdam):
    """Adam/AdamW over CPU and GPU parameters in one step(): host parameters go
    through the SIMD kernel, device parameters through one multi-tensor launch."""

    devices = frozenset({"cpu", "cuda"})
