"""Booster: ColossalAI's training-setup API on megalith.

booster = Booster(plugin=LowLevelZeroPlugin(stage=2, precision="bf16"))
model, optimizer, criterion, dataloader, lr_scheduler = booster.boost(model, optimizer, criterion,
                                                                      dataloader, lr_scheduler)
booster.backward(loss, optimizer); optimizer.step(); optimizer.zero_grad()
booster.save_model(model, "ckpt/model", shard=True)
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable
from typing import Any

import torch

from ..initialize import launch_from_torch  # noqa: F401  (booster.launch_from_torch: its old place)
from .checkpoint_io import CheckpointIO
from .plugin import Plugin, TorchDDPPlugin, plugin_from_name
from .plugin.base import PRECISIONS

#: ColossalAI's mixed_precision names megalith runs as another one (with why)
_RENAMED = {"fp16_apex": ("fp16", "apex's O1 AMP is torch AMP's fp16 autocast with loss scaling")}
#: ColossalAI's names megalith refuses (with what to pass)
_REFUSED = {
    "fp16_naive": "fp16 parameters over fp32 masters are a ZeRO plugin's precision='fp16' "
    "(LowLevelZeroPlugin(precision='fp16')); or pass 'fp16' for torch AMP",
    "fp8": "fp8 compute is not built in megalith; pass 'bf16' (or 'fp16')",
}
#: a MixedPrecision object's loss-scale attributes -> torch GradScaler's arguments
_SCALER_ARGS = {
    "initial_scale": "init_scale",
    "init_scale": "init_scale",
    "growth_factor": "growth_factor",
    "backoff_factor": "backoff_factor",
    "growth_interval": "growth_interval",
}


def precision_of(mixed_precision: Any) -> tuple[str | None, dict[str, Any]]:
    """(the precision name, torch GradScaler arguments) of Booster's mixed_precision."""
    if mixed_precision is None:
        return None, {}
    scaler: dict[str, Any] = {}
    name = mixed_precision
    if not isinstance(mixed_precision, str):
        name = getattr(mixed_precision, "precision", None)
        if not isinstance(name, str):
            raise TypeError(
                f"Booster: mixed_precision={mixed_precision!r}; expected a string or a "
                "MixedPrecision object (megalith.booster.mixed_precision) with a precision"
            )
        for attr, arg in _SCALER_ARGS.items():
            value = getattr(mixed_precision, attr, None)
            if value is not None:
                scaler[arg] = value
    if name in _REFUSED:
        raise ValueError(f"Booster: mixed_precision={name!r}: {_REFUSED[name]}")
    if name in _RENAMED:
        name, why = _RENAMED[name]
        warnings.warn(f"Booster: mixed_precision='fp16_apex' runs as 'fp16' ({why})", stacklevel=3)
    if name not in PRECISIONS:
        raise ValueError(
            f"Booster: mixed_precision={name!r}; expected one of {', '.join(PRECISIONS)} "
            "(or 'fp16_apex', or a MixedPrecision object)"
        )
    return name, scaler


def _set_amp(plugin: Plugin, precision: str | None, scaler: dict[str, Any]) -> None:
    """The Booster's mixed precision onto a plugin that does not control its own."""
    if hasattr(plugin, "set_precision"):
        plugin.set_precision(precision)
    if scaler and hasattr(plugin, "set_grad_scaler"):
        plugin.set_grad_scaler(**scaler)


#: peft's adapter parameters -> the module whose weights they adapt or replace
_PEFT_ORIGINALS = {
    "lora_A": "base_layer",
    "lora_B": "base_layer",
    "modules_to_save": "original_module",
}


def _lora_base_name(name: str) -> str | None:
    """peft's name of the weight an adapter parameter adapts or replaces:
    a.lora_A.<adapter>.weight -> a.base_layer.weight, head.modules_to_save.<adapter>.weight
    -> head.original_module.weight (None for other parameters)."""
    parts = name.split(".")
    for i, part in enumerate(parts[:-2]):
        if part in _PEFT_ORIGINALS:
            return ".".join([*parts[:i], _PEFT_ORIGINALS[part], *parts[i + 2 :]])
    return None


def _add_lora_params(model: torch.nn.Module, optimizer: Any) -> None:
    """Puts each trainable adapter parameter missing from the optimizer into the param
    group of the weight it adapts, as ColossalAI does for LoRA matrices: the usual script
    builds the optimizer on model.parameters() before booster.enable_lora adds adapters."""
    groups = optimizer.param_groups
    group_of = {id(p): g for g in groups for p in g["params"]}
    params = dict(model.named_parameters())
    for name, param in params.items():
        base = _lora_base_name(name)
        if base is None or not param.requires_grad or id(param) in group_of:
            continue
        group = group_of.get(id(params[base])) if base in params else None
        if group is None:
            warnings.warn(
                f"Booster.boost: adapter parameter {name!r} is in no param group and neither is "
                f"{base!r}, the weight it adapts, so it is not trained; build the optimizer "
                "on model.parameters() after booster.enable_lora to train it",
                stacklevel=3,
            )
            continue
        group["params"].append(param)
        group_of[id(param)] = group


class Booster:
    """ColossalAI's Booster. mixed_precision: None, "fp16", "bf16" (or "fp32"), or a
    MixedPrecision object (megalith.booster.mixed_precision; its `precision` and, for
    fp16, its loss-scale arguments are read). It applies where the plugin does not
    control precision (TorchDDPPlugin: torch AMP); a plugin that does (the ZeRO, FSDP
    and hybrid plugins) keeps its own precision= and the Booster's is ignored, with a
    warning when they differ, as in ColossalAI. plugin: a Plugin, or a name
    ("ddp", "zero1", "zero2", "gemini"; mixed_precision is then its precision; "auto":
    AutoPlugin, which plans at boost() and runs the plugin it chooses); None:
    TorchDDPPlugin."""

    def __init__(
        self,
        device: str | None = None,
        mixed_precision: str | Any | None = None,
        plugin: Plugin | str | None = None,
    ) -> None:
        precision, scaler = precision_of(mixed_precision)
        if isinstance(plugin, str):
            plugin = plugin_from_name(plugin, precision)
        elif plugin is None:
            plugin = TorchDDPPlugin()
            _set_amp(plugin, precision, scaler)
        elif not isinstance(plugin, Plugin):
            raise TypeError(
                f"Booster: plugin must be a megalith Plugin or a name, got {type(plugin).__name__}"
            )
        elif not plugin.control_precision():
            if precision is not None or not plugin.precision_from_strategy:
                _set_amp(plugin, precision, scaler)
        elif precision is not None and precision != getattr(plugin, "precision", precision):
            warnings.warn(
                f"Booster: mixed_precision={precision!r} is ignored: {type(plugin).__name__} "
                f"controls precision and trains in its precision={plugin.precision!r} (as in "
                "ColossalAI); set the plugin's precision= instead",
                stacklevel=2,
            )
        if device is not None and str(device).startswith("cuda") and not torch.cuda.is_available():
            raise RuntimeError(
                f"Booster(device={device!r}): no CUDA GPU is visible here; leave device out "
                "(megalith picks each rank's device) or run on a GPU machine"
            )
        plugin.check()
        self.plugin = plugin
        self.device = device
        self.mixed_precision = mixed_precision

    def boost(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer | None = None,
        criterion: Callable | None = None,
        dataloader: Any = None,
        lr_scheduler: Any = None,
    ) -> tuple[Any, Any, Any, Any, Any]:
        """Wraps what it is given for the plugin; returns (model, optimizer, criterion,
        dataloader, lr_scheduler), with None where None was given. A model built inside
        megalith.lazy.LazyInitContext is materialised first, or, under the plugins that
        shard it (GeminiPlugin, LowLevelZeroPlugin: plugin.materializes_per_chunk()),
        one chunk at a time as it is sharded, so no rank holds the whole model."""
        from ..lazy import LazyInitContext, is_lazy

        if getattr(model, "peft_config", None) is not None and is_lazy(model):
            from ..lazy.adapters import check_adapters

            check_adapters(model)  # peft.get_peft_model after LazyInitContext lost them
        if not _per_chunk(self.plugin):
            from ..pretrained.deferred import take_pending_load

            pending = take_pending_load(model)
            if pending is not None:  # recorded under another plugin: read it whole now
                from ..pretrained import load_into

                load_into(model, pending.directory, strict=pending.strict)
            if is_lazy(model) and not _into_shards(self.plugin):
                LazyInitContext.materialize(model)
        if optimizer is not None and getattr(model, "peft_config", None) is not None:
            _add_lora_params(model, optimizer)
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

    def enable_lora(
        self,
        model: torch.nn.Module,
        pretrained_dir: str | None = None,
        lora_config: Any = None,
        bnb_quantization_config: Any = None,
        quantize: bool = False,
    ) -> torch.nn.Module:
        """LoRA adapters on the model (Hugging Face peft), before boost(): a new adapter
        from lora_config (a peft.LoraConfig), or the one saved in pretrained_dir."""
        _require_peft()
        if not self.plugin.support_lora():
            raise NotImplementedError(
                f"Booster.enable_lora: {type(self.plugin).__name__} does not train LoRA "
                "adapters; use TorchDDPPlugin or LowLevelZeroPlugin"
            )
        if pretrained_dir is None and lora_config is None:
            raise ValueError(
                "Booster.enable_lora: pass lora_config (a peft.LoraConfig) or pretrained_dir "
                "(a directory saved by save_lora_as_pretrained)"
            )
        if quantize or bnb_quantization_config is not None:
            raise NotImplementedError(
                "Booster.enable_lora: quantize=True (QLoRA's 4-bit base weights through "
                "bitsandbytes) is not built in megalith; pass quantize=False"
            )
        return self.plugin.enable_lora(model, pretrained_dir, lora_config, None)

    def save_lora_as_pretrained(
        self, model: Any, checkpoint: str, use_safetensors: bool = False
    ) -> None:
        """The LoRA adapters and their config as peft's save_pretrained writes them."""
        _require_peft()
        if not self.plugin.support_lora():
            raise NotImplementedError(
                f"Booster.save_lora_as_pretrained: {type(self.plugin).__name__} does not "
                "train LoRA adapters; use TorchDDPPlugin or LowLevelZeroPlugin"
            )
        io = self.checkpoint_io
        save = getattr(io, "save_lora_as_pretrained", None)
        if save is None:
            raise NotImplementedError(
                f"Booster.save_lora_as_pretrained: {type(io).__name__} cannot save LoRA "
                "adapters; save the adapters with model.unwrap(unwrap_peft=False)"
                ".save_pretrained(checkpoint) on rank 0"
            )
        save(model, checkpoint, use_safetensors)

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
        use_safetensors: bool = False,
        use_async: bool = False,
    ) -> None:
        """A file, or with shard=True a directory of files of at most size_per_shard MiB
        plus the index transformers reads (see the plugin's CheckpointIO)."""
        self.checkpoint_io.save_model(
            model,
            checkpoint,
            shard=shard,
            gather_dtensor=gather_dtensor,
            prefix=prefix,
            size_per_shard=size_per_shard,
            use_safetensors=use_safetensors,
            use_async=use_async,
        )

    def load_model(
        self,
        model: Any,
        checkpoint: str,
        strict: bool = True,
        low_cpu_mem_mode: bool = True,
        num_threads: int = 1,
    ) -> None:
        """Into a boosted model: each rank reads its part (the plugin's CheckpointIO).
        Into a model not boosted yet that was built lazily (megalith.lazy) or on the meta
        device: each tensor read into storage of its own (megalith.pretrained.load_into),
        from any safetensors checkpoint transformers or megalith wrote; under GeminiPlugin
        and LowLevelZeroPlugin the checkpoint is checked now and read at boost, each
        chunk's tensors into it as it is sharded (megalith.pretrained.deferred: the
        parameters stay on the meta device until boost)."""
        if _unboosted_meta(model):
            if _per_chunk(self.plugin):  # read at boost, each chunk into its shard
                from ..pretrained.deferred import defer_load

                defer_load(model, checkpoint, strict)
                return
            from ..pretrained import load_into

            load_into(model, checkpoint, strict=strict)
            return
        self.checkpoint_io.load_model(
            model,
            checkpoint,
            strict=strict,
            low_cpu_mem_mode=low_cpu_mem_mode,
            num_threads=num_threads,
        )

    def save_optimizer(
        self,
        optimizer: Any,
        checkpoint: str,
        shard: bool = False,
        gather_dtensor: bool = True,
        prefix: str | None = None,
        size_per_shard: int = 1024,
        use_async: bool = False,
    ) -> None:
        self.checkpoint_io.save_optimizer(
            optimizer,
            checkpoint,
            shard=shard,
            gather_dtensor=gather_dtensor,
            prefix=prefix,
            size_per_shard=size_per_shard,
            use_async=use_async,
        )

    def load_optimizer(
        self,
        optimizer: Any,
        checkpoint: str,
        low_cpu_mem_mode: bool = True,
        num_threads: int = 1,
    ) -> None:
        self.checkpoint_io.load_optimizer(
            optimizer, checkpoint, low_cpu_mem_mode=low_cpu_mem_mode, num_threads=num_threads
        )

    def save_lr_scheduler(self, lr_scheduler: Any, checkpoint: str) -> None:
        self.checkpoint_io.save_lr_scheduler(lr_scheduler, checkpoint)

    def load_lr_scheduler(self, lr_scheduler: Any, checkpoint: str) -> None:
        self.checkpoint_io.load_lr_scheduler(lr_scheduler, checkpoint)


def _per_chunk(plugin: Any) -> bool:
    """Whether the plugin materialises (and loads) an unboosted lazy model a chunk at a
    time as it shards it (GeminiPlugin, LowLevelZeroPlugin)."""
    per_chunk = getattr(plugin, "materializes_per_chunk", None)
    return per_chunk is not None and bool(per_chunk())


def _into_shards(plugin: Any) -> bool:
    """Whether the plugin materialises an unboosted lazy model straight into its
    tensor-parallel shards (HybridParallelPlugin at tp_size > 1)."""
    into = getattr(plugin, "materializes_into_shards", None)
    return into is not None and bool(into())


def _unboosted_meta(model: Any) -> bool:
    from .wrappers import ModelWrapper

    if isinstance(model, ModelWrapper) or not isinstance(model, torch.nn.Module):
        return False
    return any(t.is_meta for t in [*model.parameters(), *model.buffers()])


def _require_peft() -> None:
    try:
        import peft  # noqa: F401
    except ImportError as e:
        raise ImportError("LoRA needs Hugging Face peft: pip install peft") from e
