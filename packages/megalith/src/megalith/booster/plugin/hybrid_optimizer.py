"""HybridParallelPlugin's boosted optimizer at zero_stage 0 (ZeRO stages are megalith_zero's,
zero.py): HybridOptimizer without a pipeline, PipelineOptimizer with one.

ColossalAI's optimizer surface: backward / backward_by_grad, step, zero_grad(set_to_none),
clip_grad_by_norm / clip_grad_by_value, get_grad_norm (the norm the last clipping
computed; None before), state_dict / load_state_dict (the torch optimizer's, over this
rank's parameters: its tp shards and stages), param_groups (the user's optimizer's own
group dicts, so an LR scheduler built on it before boost keeps driving it), scale_loss /
unscale_grad under fp16, parameters(), add_param_group, unwrap().

Half-precision parameters (a model built in bf16 or fp16) under precision "bf16" or
"fp16" are stepped through fp32 master weights, as ColossalAI's HybridParallelAMPOptimizer
does: each master and its optimizer states fp32, the parameter its rounded copy
(megalith.nn.optimizer.fp32_shadows, keep_masters=True).

fp16 (scaler given): backward scales the loss; before clipping or stepping the gradients
are checked for inf/nan, the flag all-reduced over every rank of the mesh, and either
every rank skips the step (the scale backs off) or every rank unscales and steps.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from typing import Any

import torch

from ..wrappers import OptimizerWrapper


def tp_grad_norm_sq(params: list[torch.nn.Parameter], tp_group: Any) -> torch.Tensor:
    """The squared L2 norm (float64) of the gradient of the whole (unsharded) model these
    parameters are part of: shards summed over the tensor-parallel group, replicated
    parameters counted once."""
    import megalith_comm as comm

    sharded = torch.zeros((), dtype=torch.float64)
    replicated = torch.zeros((), dtype=torch.float64)
    experts = torch.zeros((), dtype=torch.float64)
    ep_group = None
    for p in params:
        if p.grad is None:
            continue
        sq = p.grad.detach().double().pow(2).sum().cpu()
        if hasattr(p, "ep_spec"):  # each rank of its ep group holds other experts
            experts += sq
            ep_group = p.ep_group
        elif hasattr(p, "tp_spec"):
            sharded += sq
        else:
            replicated += sq
    comm.all_reduce(sharded, group=tp_group)
    if ep_group is not None:
        comm.all_reduce(experts, group=ep_group)
    return sharded + replicated + experts


class HybridOptimizer(OptimizerWrapper):
    """zero_stage 0: backward, then the dp all-reduce (skipped inside no_sync), in
    communication_dtype when one is given."""

    def __init__(
        self,
        optim: torch.optim.Optimizer,
        model: Any,
        max_norm: float,
        scaler: Any = None,
        communication_dtype: torch.dtype | None = None,
    ):
        super().__init__(optim)
        self.model = model
        self.max_norm = max_norm
        # megalith_zero's DynamicLossScaler, fp16 only (not `scaler`: checkpoint_io reads
        # that name as a torch GradScaler)
        self.loss_scaler = scaler
        self.communication_dtype = communication_dtype
        self.skipped_steps = 0
        self._found_inf: bool | None = None  # None: gradients not yet checked and unscaled
        self._sync = True
        self._clipped = False
        self._current_grad_norm: float | None = None
        self._masters = None
        if getattr(model, "precision", "fp32") in ("bf16", "fp16"):
            from megalith.nn.optimizer.fp32_shadows import Fp32Shadows

            self._masters = Fp32Shadows(keep_masters=True)

    # -- what ColossalAI's OptimizerWrapper offers ------------------------------------
    def parameters(self) -> Iterator[torch.nn.Parameter]:
        for group in self.optim.param_groups:
            yield from group["params"]

    def add_param_group(self, *args: Any, **kwargs: Any) -> None:
        self.optim.add_param_group(*args, **kwargs)

    def state_dict(self) -> dict[str, Any]:
        """The torch optimizer's state dict over this rank's parameters (booster.save_optimizer
        writes the whole model's, layout-free)."""
        return self.optim.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """torch's load, but with fp32 masters the states stay fp32 (torch casts each to
        its parameter's dtype: bf16 for a bf16 model)."""
        self.optim.load_state_dict(state_dict)
        if self.fp32_states:
            from ..checkpoint_io.general import restore_fp32_states

            restore_fp32_states(self.optim, state_dict["state"])

    @property
    def fp32_states(self) -> bool:
        """Half-precision parameters stepped through fp32 masters: the states are fp32."""
        return self._masters is not None

    def get_grad_norm(self, norm_type: float = 2.0, **kwargs: Any) -> float | None:
        """The whole model's gradient norm from the last clipping (max_norm or
        clip_grad_by_norm), None when no norm was computed."""
        return self._current_grad_norm

    def get_working_to_master_map(self) -> None:
        """None: at zero_stage 0 the optimizer's parameters are the model's own (the fp32
        masters of half-precision ones live inside step())."""
        return None

    def get_master_to_working_map(self) -> None:
        return None

    def update_master_params(self, model: Any) -> None:
        """The fp32 masters of half-precision parameters are taken again from them at the
        next step (a parameter written since its last step is noticed anyway)."""
        if self._masters is not None:
            self._masters = type(self._masters)(keep_masters=True)

    @property
    def loss_scale(self) -> float:
        return self.loss_scaler.scale if self.loss_scaler is not None else 1.0

    def scale_loss(self, loss: torch.Tensor) -> torch.Tensor:
        return loss * self.loss_scale if self.loss_scaler is not None else loss

    def unscale_grad(self) -> None:
        """fp16: divides the gradients by the loss scale now (once per step)."""
        self._unscale()

    def _unscale(self) -> bool:
        """fp16, once per step: divides the gradients by the loss scale and says whether
        any rank's held an inf/nan (then step() skips everywhere and they are dropped).
        One fused check-and-unscale per device and dtype (GradScaler's kernel), one
        all-reduce of the flag over the whole mesh."""
        import megalith_comm as comm

        if self.loss_scaler is None:
            return False
        if self._found_inf is None:
            by_kind: dict[tuple[torch.device, torch.dtype], list[torch.Tensor]] = {}
            for p in self._params():
                if p.grad is not None:
                    by_kind.setdefault((p.grad.device, p.grad.dtype), []).append(p.grad)
            device = next(iter(by_kind))[0] if by_kind else torch.device("cpu")
            flag = torch.zeros(1, device=device)
            for (dev, _), grads in by_kind.items():
                found = torch.zeros(1, device=dev)
                inv = torch.full((1,), 1.0 / self.loss_scaler.scale, device=dev)
                torch._amp_foreach_non_finite_check_and_unscale_(grads, found, inv)
                flag += found.to(device)
            mesh = self.model.mesh
            comm.all_reduce(flag, op="sum", group=mesh.group(mesh.names))
            self._found_inf = bool(flag.item() > 0)
        return self._found_inf

    def _params(self) -> list[torch.nn.Parameter]:
        return [p for g in self.optim.param_groups for p in g["params"]]

    def backward(
        self, loss: torch.Tensor, inputs: Any = None, retain_graph: bool = False, **kwargs: Any
    ) -> None:
        loss = self.scale_loss(loss)
        loss.backward(inputs=inputs, retain_graph=retain_graph, **kwargs)
        self._reduce_dp()

    def backward_by_grad(
        self,
        tensor: torch.Tensor,
        grad: torch.Tensor,
        inputs: Any = None,
        retain_graph: bool = False,
    ) -> None:
        torch.autograd.backward(tensor, grad, inputs=inputs, retain_graph=retain_graph)
        self._reduce_dp()

    def _reduce_dp(self) -> None:
        dp = self.model.mesh.group("dp")
        if not self._sync or dp.size == 1:
            return
        params = [p for p in self._params() if p.grad is not None]
        self._average([p.grad for p in params if not hasattr(p, "ep_spec")], dp, "avg")
        experts = [p for p in params if hasattr(p, "ep_spec")]
        if experts:
            # an expert's gradient holds the rows every rank of its ep group sent it: summed
            # over the ranks holding the same experts, it is the whole dp batch's, over dp
            grads = [p.grad for p in experts]
            self._average(grads, experts[0].moe_dp_group, "sum")
            torch._foreach_div_(grads, dp.size)

    def _average(self, grads: list[torch.Tensor], group: Any, op: str) -> None:
        import megalith_comm as comm

        if not grads or group.size == 1:
            return
        dtype = self.communication_dtype
        if dtype is None or all(g.dtype == dtype for g in grads):
            comm.all_reduce_coalesced(grads, op=op, group=group)
            return
        sent = [g.to(dtype) for g in grads]
        comm.all_reduce_coalesced(sent, op=op, group=group)
        for g, s in zip(grads, sent):
            g.copy_(s)

    def clip_grad_by_norm(
        self, max_norm: float, norm_type: float = 2.0, error_if_nonfinite: bool = False, **kw: Any
    ) -> float:
        if norm_type != 2.0:
            raise ValueError(
                f"HybridParallelPlugin clips by the L2 norm only (norm_type=2.0), not {norm_type}"
            )
        self._clipped = True
        if self._unscale():  # fp16 overflow somewhere: step() skips on every rank
            return float("inf")
        params = self._params()
        norm = self._whole_norm(params)
        self._current_grad_norm = norm
        if error_if_nonfinite and not math.isfinite(norm):
            raise RuntimeError(f"clip_grad_by_norm: the gradient norm is {norm}")
        coef = max_norm / (norm + 1e-6)
        if coef < 1.0:
            for p in params:
                if p.grad is not None:
                    p.grad.mul_(coef)
        return norm

    def clip_grad_by_value(self, clip_value: float, *args: Any, **kwargs: Any) -> None:
        """Clamps every gradient entry to [-clip_value, clip_value] (after unscaling under
        fp16); elementwise, so tp shards and stages clip as the whole model would."""
        if self._unscale():
            return
        for p in self._params():
            if p.grad is not None:
                p.grad.clamp_(-clip_value, clip_value)

    def _whole_norm(self, params: list[torch.nn.Parameter]) -> float:
        return math.sqrt(float(tp_grad_norm_sq(params, self.model.mesh.group("tp"))))

    def step(self, *args: Any, **kwargs: Any) -> Any:
        if self.loss_scaler is not None:
            bad = self._unscale()
            self.loss_scaler.update(bad)  # every rank the same flag, so the same scale
            if bad:
                self.skipped_steps += 1
                self._found_inf, self._clipped = None, False
                return None
        if self.max_norm > 0 and not self._clipped:
            self.clip_grad_by_norm(self.max_norm)
        self._clipped = False
        self._found_inf = None
        if self._masters is None:
            return self.optim.step(*args, **kwargs)
        with self._masters.stepping(self.optim):
            return self.optim.step(*args, **kwargs)

    def zero_grad(self, set_to_none: bool = True, *args: Any, **kwargs: Any) -> None:
        self._found_inf = None
        self.optim.zero_grad(set_to_none=set_to_none)

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Gradients accumulate locally; the next backward outside averages the sum."""
        self._sync = False
        try:
            yield
        finally:
            self._sync = True


class PipelineOptimizer(HybridOptimizer):
    """pp_size > 1: the pipeline runs backward (execute_pipeline) and averages over dp;
    clipping spans tp shards and stages."""

    @property
    def pipeline_model(self) -> Any:
        """checkpoint_io: the stages' whole model names their optimizer states."""
        return self.model

    def backward(self, loss: torch.Tensor, *args: Any, **kwargs: Any) -> None:
        raise RuntimeError(
            "HybridParallelPlugin with pp_size > 1: backward runs inside "
            "booster.execute_pipeline(data_iter, model, criterion, optimizer)"
        )

    def backward_by_grad(self, tensor: torch.Tensor, grad: torch.Tensor, *a: Any, **k: Any) -> None:
        self.backward(tensor)

    def _whole_norm(self, params: list[torch.nn.Parameter]) -> float:
        """Over tp shards and over the stages; a weight tied across stages counted once."""
        import megalith_comm as comm

        skip = {id(p) for p in self.model.pipe.tied.secondary_copies()}
        mine = [p for p in params if id(p) not in skip]
        total = tp_grad_norm_sq(mine, self.model.mesh.group("tp")).reshape(1)
        comm.all_reduce(total, group=self.model.mesh.group("pp"))
        return math.sqrt(float(total))
