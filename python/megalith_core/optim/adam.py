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

``master_dtype="bf16"`` steps bf16 parameters in place as bf16 masters with a
bf16 Kahan compensation (the per-parameter state 'param_comp'; the engine's
bf16_kahan master format): the master costs 4 B (value + compensation) instead
of an fp32 master's 4 B plus the bf16 model copy's 2 B, and hi + lo carries
about 16 mantissa bits. Bytes per parameter, model weight included:

    master_dtype                 state_dtype "fp32"   "bf16"   "int8"
    "fp32", fp32 model (4 + states)            12 B      8 B    ~6.03 B
    "fp32", bf16 model + fp32 master (6 + s)   14 B     10 B    ~8.03 B
    "bf16", bf16 model + comp (2 + 2 + s)      12 B      8 B    ~6.03 B

fp32 parameters with master_dtype="bf16" are refused. state_dict() keeps
'param_comp' and 'master_dtype'; a checkpoint without them starts the
compensation at zero. With fp32 masters (the default) neither appears: the
param groups, states and steps are those of the optimizer before master_dtype.
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
        master_dtype: str = "fp32",
    ) -> None:
        name = type(self).__name__
        lean_states.check_state_dtype(name, state_dtype)
        lean_states.check_master_dtype(name, master_dtype)
        if amsgrad and master_dtype != "fp32":
            raise ValueError(
                f"{name}: amsgrad needs fp32 masters (got master_dtype={master_dtype!r}); "
                "pass master_dtype='fp32' or amsgrad=False"
            )
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
        if master_dtype != "fp32":  # fp32 masters leave the param groups as they were
            defaults["master_dtype"] = master_dtype
        super().__init__(params, defaults)
        if master_dtype != "fp32":
            for group in self.param_groups:
                for index, p in enumerate(group["params"]):
                    self._check_master(p, index, group)

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
        (each param group keeps its state_dtype and master_dtype; see the module doc)."""
        wanted = [(g["state_dtype"], _master_dtype(g)) for g in self.param_groups]
        bf16 = any(master == "bf16" for _, master in wanted)
        saved = _saved_states(self.param_groups, state_dict) if bf16 else {}
        super().load_state_dict(state_dict)
        for group, (state_dtype, master_dtype) in zip(self.param_groups, wanted):
            group["state_dtype"] = state_dtype
            if master_dtype == "fp32":  # fp32 masters: no key, as before master_dtype
                group.pop("master_dtype", None)
            else:
                group["master_dtype"] = master_dtype
            for p in group["params"]:
                state = self.state.get(p)
                if state and "exp_avg" in state:
                    if master_dtype == "bf16":
                        _keep_saved_dtypes(state, saved.get(id(p), {}), p)
                    # torch.optim casts every state to the param's dtype on load: bf16
                    # states and int8/uint8 codes arrive as exact fp32 and go back here.
                    lean_states.convert(state, state_dtype)
                    if master_dtype == "bf16" and "param_comp" not in state:
                        state["param_comp"] = torch.zeros_like(p, dtype=torch.bfloat16)
                    elif master_dtype == "fp32" and "param_comp" in state:
                        del state["param_comp"]  # a bf16-master checkpoint's

    def _check_master(self, p: torch.Tensor, index: int, group: dict[str, Any]) -> None:
        if _master_dtype(group) == "bf16" and p.dtype != torch.bfloat16:
            raise TypeError(
                f"{type(self).__name__}: parameter {index} (shape {list(p.shape)}) is {p.dtype}; "
                "master_dtype='bf16' steps bf16 parameters as their own masters (Kahan "
                "compensated). Pass bf16 parameters (model.to(torch.bfloat16)), or "
                "master_dtype='fp32'"
            )

    def _check_dtype(self, p: torch.Tensor, index: int, group: dict[str, Any]) -> None:
        if _master_dtype(group) == "bf16":
            self._check_master(p, index, group)
        else:
            super()._check_dtype(p, index, group)

    def _init_state(self, p: torch.Tensor, state: dict[str, Any], group: dict[str, Any]) -> None:
        state["step"] = new_step_tensor()
        if _master_dtype(group) == "bf16":  # bf16 params, fp32 or lean states, comp
            if group["state_dtype"] != "fp32":
                state.update(lean_states.new_states(p, group["state_dtype"]))
            else:
                state["exp_avg"] = torch.zeros_like(p, dtype=torch.float32)
                state["exp_avg_sq"] = torch.zeros_like(p, dtype=torch.float32)
            state["param_comp"] = torch.zeros_like(p, dtype=torch.bfloat16)
            return  # amsgrad is refused with bf16 masters
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
            param_comps=[s["param_comp"] for s in states]
            if _master_dtype(group) == "bf16"
            else None,
            seed=group["seed"],
        )
        increment_steps(states)
        return found


def _master_dtype(group: dict[str, Any]) -> str:
    """A param group's master_dtype: only groups with bf16 masters carry the key."""
    return group.get("master_dtype", "fp32")


def _saved_states(groups: list[dict[str, Any]], state_dict: dict[str, Any]) -> dict[int, dict]:
    """The checkpoint's per-parameter states keyed by id() of the parameter they load into
    (torch.optim's order-based mapping), before torch casts them to the parameter's dtype."""
    ours = [p for g in groups for p in g["params"]]
    theirs = [i for g in state_dict["param_groups"] for i in g["params"]]
    return {id(p): state_dict["state"].get(i, {}) for p, i in zip(ours, theirs)}


def _keep_saved_dtypes(state: dict[str, Any], saved: dict[str, Any], p: torch.Tensor) -> None:
    """torch.optim.load_state_dict casts states to a bf16 parameter's dtype: fp32 states
    of a bf16 master would lose their low bits. Takes them as saved instead."""
    for name in ("exp_avg", "exp_avg_sq", "max_exp_avg_sq"):
        value = saved.get(name)
        if torch.is_tensor(value) and value.is_floating_point():
            state[name] = value.to(device=p.device, copy=True)


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
