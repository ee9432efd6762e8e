"""MoeHybridParallelPlugin(ep_size > 1, zero_stage=1): ZeRO for the dense weights, a plain
optimizer for the experts, as ColossalAI's rule has it (dense parameters' states sharded
over dp, expert parameters' over moe_dp: here each rank's experts keep their states whole,
their moe_dp replicas each holding a copy).

megalith_zero shards the dense parameters over the dp axis (shard(outside=experts)); the
expert parameters, already split over ep, stay the model's own tensors and are stepped by
an optimizer of the user's optimizer's class (HybridOptimizer: their gradients summed over
moe_dp and divided by dp after each synchronised backward, as at zero_stage 0; fp32
masters under bf16). The user's param groups keep the dense parameters, so an LR
scheduler built on them drives ZeRO, and each step copies their hyperparameters into the
experts' groups. Clipping is by the whole model's norm: ZeRO's dense norm with the
experts' squares (summed over ep) added.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import math
from collections.abc import Iterator
from typing import Any

import torch

from .base import require
from .hybrid_optimizer import HybridOptimizer
from .zero_wrappers import ZeroModelWrapper, ZeroOptimizerWrapper


class MoeZeroModel(ZeroModelWrapper):
    """ZeRO's model; mesh and precision for the experts' HybridOptimizer."""

    def __init__(self, zmodel: Any, mesh: Any, precision: str) -> None:
        super().__init__(zmodel)
        self.mesh = mesh
        self.precision = precision
        #: Fp32Shadows of the experts' optimizer under bf16 (set by zero_beside_experts)
        self.expert_masters: Any = None

    def expert_value(self, p: torch.nn.Parameter) -> torch.Tensor:
        """An expert weight's fp32 master under bf16 (what the files hold, as ZeRO's
        masters for the dense ones), else the weight itself."""
        master = self.expert_masters.master(p) if self.expert_masters is not None else None
        return p.detach() if master is None else master

    def set_expert(self, p: torch.nn.Parameter, value: torch.Tensor) -> None:
        """This rank's part of an expert weight, its master too under bf16."""
        if self.expert_masters is not None:
            self.expert_masters.set_master(p, value.to(p.device))
        else:
            with torch.no_grad():
                p.copy_(value)

    def load_state_dict(  # type: ignore[override]
        self, state_dict: dict[str, torch.Tensor], strict: bool = True, assign: bool = False
    ) -> Any:
        """ZeRO's load of the dense weights and buffers (collective); each expert weight
        from its whole tensor (this rank's experts taken) or from this rank's part, as
        state_dict() gives it."""
        result = super().load_state_dict(state_dict, strict=strict, assign=assign)
        with torch.no_grad():
            for name, p in self.unwrap().named_parameters():
                if not hasattr(p, "ep_spec") or name not in state_dict:
                    continue
                src = state_dict[name]
                if tuple(src.shape) != tuple(p.shape):
                    src = p.ep_spec.take(src, p.ep_group.rank, p.ep_group.size)
                self.set_expert(p, src)
        return result


def expert_sum_sq(params: list[torch.nn.Parameter]) -> float:
    """The squared L2 norm of the experts' gradients of the whole model: each rank of an
    ep group holds other experts (its moe_dp replicas hold the same, counted once)."""
    import megalith_comm as comm

    sq = torch.zeros((), dtype=torch.float64)
    for p in params:
        if p.grad is not None:
            sq += p.grad.detach().double().pow(2).sum().cpu()
    if params:  # every rank takes part, whatever its gradients
        comm.all_reduce(sq, group=params[0].ep_group)
    return float(sq)


class MoeZeroOptimizer(ZeroOptimizerWrapper):
    """ZeroOptimizerWrapper over the dense parameters; `experts` (a HybridOptimizer over
    this rank's experts) reduced, clipped, stepped and zeroed beside it."""

    def __init__(self, zopt: Any, model: MoeZeroModel, max_norm: float, experts: HybridOptimizer):
        super().__init__(zopt, model, max_norm, False)
        self.experts = experts

    def _expert_params(self) -> list[torch.nn.Parameter]:
        return self.experts._params()

    def backward(
        self, loss: torch.Tensor, inputs: Any = None, retain_graph: bool = False, **kwargs: Any
    ) -> None:
        super().backward(loss, inputs=inputs, retain_graph=retain_graph, **kwargs)
        self.experts._reduce_dp()

    def backward_by_grad(
        self,
        tensor: torch.Tensor,
        grad: torch.Tensor,
        inputs: Any = None,
        retain_graph: bool = False,
    ) -> None:
        super().backward_by_grad(tensor, grad, inputs=inputs, retain_graph=retain_graph)
        self.experts._reduce_dp()

    def _clip(self, max_norm: float, norm_type: float = 2.0) -> float:
        params = self._expert_params()
        norm = self.zero_optimizer.clip_grad_norm_(
            max_norm, norm_type, extra_sum_sq=expert_sum_sq(params)
        )
        coef = min(1.0, max_norm / (norm + 1e-6))  # ZeRO's coefficient for the dense part
        if coef < 1.0:
            for p in params:
                if p.grad is not None:
                    p.grad.mul_(coef)
        return norm

    def clip_grad_by_value(self, clip_value: float, *args: Any, **kwargs: Any) -> None:
        super().clip_grad_by_value(clip_value)
        for p in self._expert_params():
            if p.grad is not None:
                p.grad.clamp_(-clip_value, clip_value)

    def _follow_groups(self) -> None:
        """The user's param groups' hyperparameters (an LR scheduler's lr) into the experts'."""
        for user, mine in zip(self.param_groups, self.experts.optim.param_groups):
            mine.update({k: v for k, v in user.items() if k != "params"})

    def step(self, *args: Any, **kwargs: Any) -> Any:
        norm = self._clipped_norm
        if norm is None:  # max_norm 0: the norm is reported, the coefficient is 1
            norm = self._clip(self.max_norm if self.max_norm > 0 else math.inf)
        self._grad_norm = norm
        self._clipped_norm = None
        self._follow_groups()
        self.experts.step()
        return self.zero_optimizer.step()

    def get_grad_norm(self, norm_type: float = 2.0, **kwargs: Any) -> float | None:
        """The whole model's gradient norm of the last step (None before one)."""
        return self._grad_norm

    def zero_grad(self, set_to_none: bool = True) -> None:
        super().zero_grad(set_to_none)
        self.experts.zero_grad(set_to_none)

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        with self.zero_optimizer.no_sync(), self.experts.no_sync():
            yield

    def state_dict(self, only_rank_0: bool | None = None) -> dict[str, Any]:
        """ZeRO's torch form of the dense parameters' states (whole, collective), and under
        "expert_state" the experts' optimizer's state dict over this rank's experts."""
        out = super().state_dict(only_rank_0)
        out["expert_state"] = self.experts.state_dict()
        return out

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        dense = {k: v for k, v in state_dict.items() if k != "expert_state"}
        super().load_state_dict(dense)
        if "expert_state" in state_dict:
            self.experts.load_state_dict(state_dict["expert_state"])


def _same_kind(optimizer: torch.optim.Optimizer, groups: list[dict[str, Any]]) -> Any:
    """An optimizer of the user's optimizer's class over `groups` (each with every
    hyperparameter of its user group)."""
    cls = type(optimizer)
    accepted = inspect.signature(cls.__init__).parameters
    defaults = {k: v for k, v in optimizer.defaults.items() if k in accepted}
    try:
        return cls(groups, **defaults)
    except (TypeError, ValueError) as e:
        raise ValueError(
            f"MoeHybridParallelPlugin(zero_stage=1): the experts are stepped by a second "
            f"{cls.__name__} built from the optimizer's param groups, which failed ({e}); use "
            "a torch optimizer (SGD, Adam, AdamW) or megalith's, or zero_stage=0"
        ) from e


def zero_beside_experts(plugin: Any, model: torch.nn.Module, optimizer: Any) -> tuple[Any, Any]:
    """ZeRO over the dense parameters, the experts stepped beside it (module docstring)."""
    what = f"MoeHybridParallelPlugin(ep_size={plugin.ep_size}, zero_stage=1)"
    zero = require("megalith_zero", "megalith-zero", what)
    if optimizer is None:
        raise ValueError(f"{what}: boost() needs the optimizer")
    experts = [p for p in model.parameters() if hasattr(p, "ep_spec")]
    ids = {id(p) for p in experts}
    if any(optimizer.state.get(p) for p in experts):
        raise ValueError(
            f"{what}: the optimizer has stepped the experts already; boost a fresh optimizer "
            "and restore its states with booster.load_optimizer"
        )
    expert_groups = []
    for g in optimizer.param_groups:
        hyper = {k: v for k, v in g.items() if k != "params"}
        expert_groups.append({**hyper, "params": [p for p in g["params"] if id(p) in ids]})
        g["params"] = [p for p in g["params"] if id(p) not in ids]
    # the experts' norm joins ZeRO's before any update: nothing steps during backward
    config = dataclasses.replace(plugin.strategy.zero_config(), step_in_backward=False)
    originals = {}
    if config.param_dtype != torch.float32:  # the experts compute in the dense dtype
        for p in experts:
            originals[id(p)] = p.detach().float().clone()
            p.data = p.data.to(config.param_dtype)
    zmodel, zopt = zero.shard(
        model, optimizer, config, mesh=plugin.mesh, axis="dp",
        model_parallel=plugin._model_parallel(zero), outside=experts,
    )  # fmt: skip
    wrapped = MoeZeroModel(zmodel, plugin.mesh, plugin.precision)
    expert_opt = HybridOptimizer(
        _same_kind(optimizer, expert_groups), wrapped, 0.0, None, plugin.communication_dtype
    )
    if expert_opt._masters is not None:  # fp32 masters from the fp32 values, as ZeRO's
        wrapped.expert_masters = expert_opt._masters
        for p in experts:
            wrapped.set_expert(p, originals[id(p)])
    return wrapped, MoeZeroOptimizer(zopt, wrapped, plugin.max_norm, expert_opt)


__all__ = ["MoeZeroModel", "MoeZeroOptimizer", "expert_sum_sq", "zero_beside_experts"]
