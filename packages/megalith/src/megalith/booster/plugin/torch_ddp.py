"""TorchDDPPlugin: plain data parallelism through torch's DistributedDataParallel.

Mixed precision is torch's own: autocast around forward, GradScaler for fp16.
With one rank there is nothing to synchronise, and DDP would still copy every gradient
into its buckets and all-reduce them (10% of a 1.3B GPT's step on an H200, and a
bucket-sized copy of the gradients in memory): the model is then wrapped in
`OneRank`, which keeps DDP's `.module` and `no_sync()` and does nothing else.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import torch

from megalith.strategy import Strategy

from ..wrappers import ModelWrapper, OptimizerWrapper
from .base import StrategyPlugin, check_precision, world

if TYPE_CHECKING:
    from ..checkpoint_io import CheckpointIO

_DTYPE = {"fp16": torch.float16, "bf16": torch.bfloat16}


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
    def __init__(self, module: torch.nn.Module, precision: str):
        super().__init__(module)
        self.precision = precision

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        if self.precision == "fp32":
            return self.module(*args, **kwargs)
        device = next(self.module.parameters()).device.type
        with torch.autocast(device_type=device, dtype=_DTYPE[self.precision]):
            return self.module(*args, **kwargs)


class DDPOptimizer(OptimizerWrapper):
    def __init__(
        self, optim: torch.optim.Optimizer, model: DDPModel, precision: str, max_norm: float
    ):
        super().__init__(optim)
        self.model = model
        self.max_norm = max_norm
        device = next(model.parameters()).device.type
        self.scaler = torch.amp.GradScaler(device) if precision == "fp16" else None
        self._clip: float | None = None

    def backward(self, loss: torch.Tensor, *args: Any, **kwargs: Any) -> None:
        (self.scaler.scale(loss) if self.scaler else loss).backward(*args, **kwargs)

    def clip_grad_by_norm(self, max_norm: float, norm_type: float = 2.0) -> float:
        if self.scaler:
            self.scaler.unscale_(self.optim)
        params = [p for g in self.optim.param_groups for p in g["params"]]
        return float(torch.nn.utils.clip_grad_norm_(params, max_norm, norm_type))

    def step(self, *args: Any, **kwargs: Any) -> Any:
        if self.max_norm > 0:
            self.clip_grad_by_norm(self.max_norm)
        if self.scaler is None:
            return self.optim.step(*args, **kwargs)
        out = self.scaler.step(self.optim, *args, **kwargs)
        self.scaler.update()
        return out

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        with self.model.module.no_sync():
            yield


class TorchDDPPlugin(StrategyPlugin):
    """ColossalAI's TorchDDPPlugin arguments; the Booster's mixed_precision sets precision."""

    runs = ("ddp",)

    def __init__(
        self,
        broadcast_buffers: bool = True,
        bucket_cap_mb: int = 25,
        find_unused_parameters: bool = False,
        check_reduction: bool = False,
        gradient_as_bucket_view: bool = False,
        static_graph: bool = False,
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
        super().__init__(Strategy(plugin="ddp", max_norm=max_norm))

    def _default_options(self) -> None:
        self.ddp_kwargs = {}

    def set_precision(self, precision: str | None) -> None:
        """None is fp32 (the Booster's mixed_precision=None)."""
        self.precision = check_precision("TorchDDPPlugin", precision)

    def configure(self, model, optimizer, criterion, dataloader, lr_scheduler):
        w = world()
        if w.device.type == "cuda":
            model = model.to(w.device)
        if w.world_size == 1:
            ddp: torch.nn.Module = OneRank(model)
        else:
            ddp = torch.nn.parallel.DistributedDataParallel(model, **self.ddp_kwargs)
        wrapped = DDPModel(ddp, self.precision)
        opt = (
            DDPOptimizer(optimizer, wrapped, self.precision, self.max_norm)
            if optimizer is not None
            else None
        )
        return wrapped, opt, criterion, dataloader, lr_scheduler

    def no_sync(self, model: Any, optimizer: Any) -> contextlib.AbstractContextManager:
        return model.module.no_sync()

    def get_checkpoint_io(self) -> CheckpointIO:
        """Every rank holds the whole model: rank 0 writes it, without megalith-zero."""
        from ..checkpoint_io import GeneralCheckpointIO

        return GeneralCheckpointIO()
