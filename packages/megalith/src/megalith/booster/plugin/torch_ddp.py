"""TorchDDPPlugin: plain data parallelism through torch's DistributedDataParallel.

As in ColossalAI, the plugin does not control precision: the Booster's mixed_precision
("fp16" or "bf16", or a MixedPrecision object) is torch's own AMP, autocast around
forward and, for fp16, a GradScaler with the object's scale arguments. On GPUs the
model's BatchNorm layers become SyncBatchNorm (ColossalAI's conversion); torch has no
SyncBatchNorm for CPU modules, so on CPU ranks each rank keeps its own statistics.
With one rank there is nothing to synchronise, and DDP would still copy every gradient
into its buckets and all-reduce them (10% of a 1.3B GPT's step on an H200, and a
bucket-sized copy of the gradients in memory): the model is then wrapped in
`OneRank`, which keeps DDP's `.module` and `no_sync()` and does nothing else.
A failure of DDP's own collectives (a peer dead or hung) is raised as megalith_comm's
CommError naming the rank and the op (ddp_diagnosis.py), from a bare loss.backward() too
(the gradient all_reduce runs through a diagnosing DDP communication hook).
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import torch

from megalith.strategy import Strategy

from ..wrappers import ModelWrapper, OptimizerWrapper, _total_norm
from .base import StrategyPlugin, check_precision, warn_non_defaults, world
from .ddp_diagnosis import (
    BACKWARD,
    BUILD,
    FORWARD,
    count_sync,
    diagnosed,
    install_hook,
    refuse_meta,
)
from .dp_plugin_base import DPPluginBase

if TYPE_CHECKING:
    from ..checkpoint_io import CheckpointIO

_DTYPE = {"fp16": torch.float16, "bf16": torch.bfloat16}
#: torch's GradScaler's own defaults (ColossalAI's FP16TorchMixedPrecision keeps them)
GRAD_SCALER_DEFAULTS = dict(
    init_scale=2.0**16, growth_factor=2.0, backoff_factor=0.5, growth_interval=2000
)


class OneRank(torch.nn.Module):
    """DDP's surface for a world of one: `.module`, `no_sync()`, forward passes through."""

    def __init__(self, module: torch.nn.Module):
        super().__init__()
        self.module = module

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.module(*args, **kwargs)

    def no_sync(self) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext()


class DDPModel(ModelWrapper):
    def __init__(self, module: torch.nn.Module, precision: str, user: torch.nn.Module):
        super().__init__(module, user)
        self.precision = precision

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        with diagnosed(FORWARD):
            if self.precision == "fp32":
                return self.module(*args, **kwargs)
            device = next(self.module.parameters()).device.type
            with torch.autocast(device_type=device, dtype=_DTYPE[self.precision]):
                return self.module(*args, **kwargs)


class DDPOptimizer(OptimizerWrapper):
    def __init__(
        self,
        optim: torch.optim.Optimizer,
        model: DDPModel,
        precision: str,
        max_norm: float,
        scaler_kwargs: dict[str, Any] | None = None,
    ):
        super().__init__(optim)
        self.model = model
        self.max_norm = max_norm
        device = next(model.parameters()).device.type
        self.scaler = (
            torch.amp.GradScaler(device, **(scaler_kwargs or {})) if precision == "fp16" else None
        )
        self._unscaled = False
        self._clipped_norm: float | None = None

    def backward(
        self, loss: torch.Tensor, inputs: Any = None, retain_graph: bool = False, **kwargs: Any
    ) -> None:
        count_sync(self.model.module)
        with diagnosed(BACKWARD):
            self.scale_loss(loss).backward(inputs=inputs, retain_graph=retain_graph, **kwargs)

    def backward_by_grad(
        self,
        tensor: torch.Tensor,
        grad: torch.Tensor,
        inputs: Any = None,
        retain_graph: bool = False,
    ) -> None:
        if self.scaler is not None:
            grad = self.scaler.scale(grad)
        count_sync(self.model.module)
        with diagnosed(BACKWARD):
            torch.autograd.backward(tensor, grad, inputs=inputs, retain_graph=retain_graph)

    def scale_loss(self, loss: torch.Tensor) -> torch.Tensor:
        return self.scaler.scale(loss) if self.scaler is not None else loss

    def unscale_grad(self) -> None:
        """fp16: divides the gradients by the loss scale (once per step)."""
        if self.scaler is not None and not self._unscaled:
            self.scaler.unscale_(self.optim)
            self._unscaled = True

    def clip_grad_by_norm(
        self,
        max_norm: float,
        norm_type: float = 2.0,
        error_if_nonfinite: bool = False,
        *args: Any,
        **kwargs: Any,
    ) -> torch.Tensor:
        self.unscale_grad()
        norm = super().clip_grad_by_norm(max_norm, norm_type, error_if_nonfinite, *args, **kwargs)
        if norm_type == 2.0:
            self._clipped_norm = float(norm)
        return norm

    def clip_grad_by_value(self, clip_value: float, *args: Any, **kwargs: Any) -> None:
        self.unscale_grad()
        super().clip_grad_by_value(clip_value, *args, **kwargs)

    def step(self, *args: Any, **kwargs: Any) -> Any:
        self.unscale_grad()
        if self.max_norm > 0 and self._clipped_norm is None:
            self.clip_grad_by_norm(self.max_norm)
        norm = self._clipped_norm  # the norm before clipping, as ColossalAI reports it
        self._grad_norm = norm if norm is not None else _total_norm(self.parameters)
        self._unscaled, self._clipped_norm = False, None
        if self.scaler is None:
            return self.optim.step(*args, **kwargs)
        out = self.scaler.step(self.optim, *args, **kwargs)
        self.scaler.update()
        return out

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        with self.model.module.no_sync():
            yield


class TorchDDPPlugin(StrategyPlugin, DPPluginBase):
    """ColossalAI's TorchDDPPlugin arguments; the Booster's mixed_precision sets precision.
    max_norm (megalith's): clip to this global norm at every step."""

    runs = ("ddp",)

    def __init__(
        self,
        broadcast_buffers: bool = True,
        bucket_cap_mb: int = 25,
        find_unused_parameters: bool = False,
        check_reduction: bool = False,
        gradient_as_bucket_view: bool = False,
        static_graph: bool = False,
        fp8_communication: bool = False,
        max_norm: float = 0.0,
    ) -> None:
        given = dict(
            broadcast_buffers=broadcast_buffers,
            bucket_cap_mb=bucket_cap_mb,
            find_unused_parameters=find_unused_parameters,
            check_reduction=check_reduction,
            gradient_as_bucket_view=gradient_as_bucket_view,
            static_graph=static_graph,
        )
        # Only what differs from torch's defaults (some names are deprecated there).
        defaults = dict(
            broadcast_buffers=True,
            bucket_cap_mb=25,
            find_unused_parameters=False,
            check_reduction=False,
            gradient_as_bucket_view=False,
            static_graph=False,
        )
        self.ddp_kwargs = {k: v for k, v in given.items() if defaults[k] != v}
        warn_non_defaults(
            "TorchDDPPlugin",
            {"fp8_communication": fp8_communication},
            {"fp8_communication": (False, "megalith all-reduces gradients in their own dtype")},
        )
        self.grad_scaler_kwargs: dict[str, Any] = {}
        super().__init__(Strategy(plugin="ddp", max_norm=max_norm))

    def _default_options(self) -> None:
        self.ddp_kwargs = {}
        self.grad_scaler_kwargs = {}

    def control_precision(self) -> bool:
        return False

    def support_lora(self) -> bool:
        return True

    def set_precision(self, precision: str | None) -> None:
        """None is fp32 (the Booster's mixed_precision=None)."""
        self.precision = check_precision("TorchDDPPlugin", precision)

    def set_grad_scaler(self, **kwargs: Any) -> None:
        """fp16: torch GradScaler arguments (init_scale, growth_factor, backoff_factor,
        growth_interval), from the Booster's MixedPrecision object."""
        self.grad_scaler_kwargs = {k: v for k, v in kwargs.items() if v is not None}

    def configure(self, model, optimizer, criterion, dataloader, lr_scheduler):
        refuse_meta(model)
        w = world()
        user = model
        if w.device.type == "cuda":
            model = model.to(w.device)
            model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)
            user = model
        elif w.world_size > 1 and any(
            isinstance(m, torch.nn.modules.batchnorm._BatchNorm) for m in model.modules()
        ):
            warnings.warn(
                "TorchDDPPlugin: BatchNorm statistics stay per rank on CPU ranks (torch's "
                "SyncBatchNorm runs on GPUs only; on GPUs they are synchronised as in ColossalAI)",
                stacklevel=3,
            )
        if w.world_size == 1:
            ddp: torch.nn.Module = OneRank(model)
        else:
            with diagnosed(BUILD):
                ddp = torch.nn.parallel.DistributedDataParallel(model, **self.ddp_kwargs)
            install_hook(ddp)
        wrapped = DDPModel(ddp, self.precision, user)
        opt = optimizer
        if optimizer is not None and not isinstance(optimizer, OptimizerWrapper):
            opt = DDPOptimizer(
                optimizer, wrapped, self.precision, self.max_norm, self.grad_scaler_kwargs
            )
        return wrapped, opt, criterion, dataloader, lr_scheduler

    def no_sync(self, model: Any, optimizer: Any) -> contextlib.AbstractContextManager:
        if not isinstance(model, DDPModel):
            raise ValueError(
                "TorchDDPPlugin.no_sync: pass the model booster.boost returned "
                "(booster.no_sync(model))"
            )
        return model.module.no_sync()

    def get_checkpoint_io(self) -> CheckpointIO:
        """Every rank holds the whole model: rank 0 writes it, without megalith-zero."""
        from ..checkpoint_io import GeneralCheckpointIO

        return GeneralCheckpointIO()
