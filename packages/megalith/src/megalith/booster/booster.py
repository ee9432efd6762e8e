"""Booster: ColossalAI's training-setup API on megalith.

booster = Booster(plugin=LowLevelZeroPlugin(stage=2, precision="bf16"))
model, optimizer, criterion, dataloader, lr_scheduler = booster.boost(model, optimizer, criterion,
                                                                      dataloader, lr_scheduler)
booster.backward(loss, optimizer); optimizer.step(); optimizer.zero_grad()
booster.save_model(model, "ckpt/model", shard=True)
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import torch

from .checkpoint_io import CheckpointIO
from .plugin import Plugin, TorchDDPPlugin, plugin_from_name
from .plugin.base import world


class Booster:
    def __init__(
        self,
        device: str | None = None,
        mixed_precision: str | None = None,
        plugin: Plugin | str | None = None,
    ) -> None:
        if isinstance(plugin, str):
            plugin = plugin_from_name(plugin, mixed_precision)
        elif plugin is None:
            plugin = TorchDDPPlugin()
            plugin.set_precision(mixed_precision)
        elif not isinstance(plugin, Plugin):
            raise TypeError(
                f"Booster: plugin must be a megalith Plugin or a name, got {type(plugin).__name__}"
            )
        elif mixed_precision is not None:
            plugin.set_precision(mixed_precision)
        if device is not None and str(device).startswith("cuda") and not torch.cuda.is_available():
            raise RuntimeError(
                f"Booster(device={device!r}): no CUDA GPU is visible here; leave device out "
                "(megalith picks each rank's device) or run on a GPU machine"
            )
        plugin.check()
        self.plugin = plugin
        self.device = device

    def boost(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer | None = None,
        criterion: Callable | None = None,
        dataloader: Any = None,
        lr_scheduler: Any = None,
    ) -> tuple[Any, Any, Any, Any, Any]:
        """Wraps what it is given for the plugin; returns (model, optimizer, criterion,
        dataloader, lr_scheduler), with None where None was given."""
        return self.plugin.configure(model, optimizer, criterion, dataloader, lr_scheduler)

    def setup(
        self,
        *,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer | None = None,
        train_dataloader: Any = None,
        criterion: Callable | None = None,
        lr_scheduler: Any = None,
    ) -> tuple[Any, Any, Any, Any]:
        """Keyword form of boost: returns (model, optimizer, train_dataloader, criterion)."""
        m, o, c, d, _ = self.boost(model, optimizer, criterion, train_dataloader, lr_scheduler)
        return m, o, d, c

    def backward(self, loss: torch.Tensor, optimizer: Any) -> None:
        optimizer.backward(loss)

    def no_sync(
        self, model: Any = None, optimizer: Any = None
    ) -> contextlib.AbstractContextManager:
        return self.plugin.no_sync(model, optimizer)

    def execute_pipeline(
        self,
        data_iter: Any,
        model: Any,
        criterion: Callable,
        optimizer: Any = None,
        return_loss: bool = True,
        return_outputs: bool = False,
    ) -> dict[str, Any]:
        """One training step of a pipelined model (HybridParallelPlugin with pp_size > 1):
        takes the next batch of data_iter, runs every micro-batch's forward and backward
        in the schedule's order; then call optimizer.step(). criterion(outputs, micro_batch)
        as ColossalAI calls it. Returns {"loss": the batch's loss on every rank (or None),
        "outputs": with return_outputs, the last stage's outputs for the whole batch (the
        micro-batches' concatenated; an object with .logits for a causal LM) on the rank
        holding the last stage, None elsewhere}."""
        run = getattr(self.plugin, "execute_pipeline", None)
        if run is None:
            raise NotImplementedError(
                f"Booster.execute_pipeline needs a pipeline plugin (HybridParallelPlugin with "
                f"pp_size > 1), not {type(self.plugin).__name__}: run a step with model(...), "
                "booster.backward(loss, optimizer) and optimizer.step()"
            )
        loss = run(data_iter, model, criterion, optimizer, return_outputs=return_outputs)
        outputs = model.last_outputs if return_outputs else None
        return {"loss": loss if return_loss else None, "outputs": outputs}

    # -- checkpoints: the plugin's CheckpointIO (ColossalAI's names and arguments) ---------
    @property
    def checkpoint_io(self) -> CheckpointIO:
        """The plugin's, asked for each time: it follows the plugin's configuration."""
        return self.plugin.get_checkpoint_io()

    def save_model(
        self,
        model: Any,
        checkpoint: str,
        shard: bool = False,
        gather_dtensor: bool = True,
        prefix: str | None = None,
        size_per_shard: int = 1024,
        use_safetensors: bool = True,
    ) -> None:
        """safetensors always (nothing is pickled): a file, or with shard=True a directory of
        files of at most size_per_shard MiB plus model.safetensors.index.json."""
        self.checkpoint_io.save_model(
            model, checkpoint, shard, gather_dtensor, prefix, size_per_shard, use_safetensors
        )

    def load_model(self, model: Any, checkpoint: str, strict: bool = True) -> None:
        self.checkpoint_io.load_model(model, checkpoint, strict)

    def save_optimizer(
        self,
        optimizer: Any,
        checkpoint: str,
        shard: bool = False,
        gather_dtensor: bool = True,
        prefix: str | None = None,
        size_per_shard: int = 1024,
    ) -> None:
        self.checkpoint_io.save_optimizer(
            optimizer, checkpoint, shard, gather_dtensor, prefix, size_per_shard
        )

    def load_optimizer(
        self, optimizer: Any, checkpoint: str, prefix: str | None = None, size_per_shard: int = 1024
    ) -> None:
        self.checkpoint_io.load_optimizer(optimizer, checkpoint, prefix, size_per_shard)

    def save_lr_scheduler(self, lr_scheduler: Any, checkpoint: str) -> None:
        self.checkpoint_io.save_lr_scheduler(lr_scheduler, checkpoint)

    def load_lr_scheduler(self, lr_scheduler: Any, checkpoint: str) -> None:
        self.checkpoint_io.load_lr_scheduler(lr_scheduler, checkpoint)


def launch_from_torch(seed: int = 1024, verbose: bool = False, **kwargs: Any) -> None:
    """Sets up the process group from torchrun's (or `megalith run`'s) environment, like
    colossalai.launch_from_torch, and seeds torch."""
    world()
    torch.manual_seed(seed)
