"""LowLevelZeroPlugin (ZeRO stage 1/2) and GeminiPlugin (stage 3) on megalith_zero.

Arguments keep ColossalAI's names and defaults where they mean the same thing; those
that only tune ColossalAI's own machinery are accepted and warned about once; those
that would change results megalith cannot reproduce are refused with the fix.
Composition order (one place, fixed): model to the rank's device -> floating-point
buffers to the working dtype (ColossalAI's cast, so BatchNorm's running statistics
match the half-precision parameters) -> megalith_zero.shard (working params in the
chosen precision on chunk memory, fp32 master shards, gradient reduction hooks,
stage-3 gather hooks) -> the wrappers the Booster hands back (zero_wrappers.py).
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any

import torch

from megalith.lazy import is_lazy
from megalith.lazy.chunks import ChunkMaterializer
from megalith.pretrained.deferred import take_pending_load
from megalith.strategy import Strategy, ZeroTuning, colossal_loss_scale

from ..wrappers import OptimizerWrapper
from .base import StrategyPlugin, check_precision, require, warn_non_defaults, world
from .dp_plugin_base import DPPluginBase
from .gemini_model import GeminiDDP
from .zero_optimizers import GeminiOptimizer, LowLevelZeroOptimizer
from .zero_wrappers import ZeroModelWrapper, ZeroOptimizerWrapper  # noqa: F401  (imported from here)

if TYPE_CHECKING:
    from ..checkpoint_io import CheckpointIO

_HALF = {"fp16": torch.float16, "bf16": torch.bfloat16}
_FP8 = "megalith computes and communicates in the working dtype (fp8 is not built)"
_EXTRA_DP = (
    "megalith shards over every data-parallel rank; an extra replication axis gives the "
    "same numbers"
)


def cast_buffers(model: torch.nn.Module, precision: str) -> None:
    """Floating-point buffers (BatchNorm's running statistics, ...) to the working dtype,
    as ColossalAI's ZeRO plugins cast them: a half-precision model with fp32 buffers
    fails in BatchNorm ("expected scalar type Half but found Float")."""
    dtype = _HALF.get(precision)
    if dtype is None:
        return
    for module in model.modules():
        for name, buf in module._buffers.items():
            if buf is not None and buf.is_floating_point() and buf.dtype != dtype:
                module._buffers[name] = buf.to(dtype)


def _check_common(owner: str, precision: str, norm_type: float, master_weights: bool) -> None:
    if norm_type != 2.0:
        raise ValueError(
            f"{owner}: norm_type={norm_type}; ZeRO clips by the L2 norm: pass norm_type=2.0"
        )
    if not master_weights and precision != "fp32":
        raise ValueError(
            f"{owner}: master_weights=False; megalith always updates fp32 master weights "
            "(the half-precision update without them gives other numbers): pass "
            "master_weights=True"
        )


class _ZeroPlugin(StrategyPlugin, DPPluginBase):
    #: GeminiDDP's force_outputs_fp32
    force_outputs_fp32 = False
    #: ColossalAI's optimizer state_dict default (GeminiOptimizer gathers on rank 0 only)
    only_rank_0 = False
    tp_size = 1
    extra_dp_size = 1
    #: the classes boost() hands back (ColossalAI's names: zero_optimizers.py)
    model_class: type = ZeroModelWrapper
    optimizer_class: type = LowLevelZeroOptimizer
    #: ColossalAI's name for the plugin's CheckpointIO (checkpoint_io/zero.py)
    checkpoint_io_name = "LowLevelZeroCheckpointIO"

    @property
    def stage(self) -> int:
        return self.strategy.zero_stage

    @property
    def dp_rank_size(self) -> tuple[int, int]:
        """This rank's data-parallel rank and the dp size: with tp_size > 1 the tp ranks
        of one replica (neighbours in gemini_tp.py's mesh) take the same data."""
        w = world()
        return w.rank // self.tp_size, w.world_size // self.tp_size

    @property
    def _offload(self) -> Any:
        """The megalith_offload.OffloadConfig, or None."""
        return self.strategy.offload

    def set_offload(self, step_in_backward: bool | None = None, **kwargs: Any) -> None:
        """Offloads optimizer states: kwargs of megalith_offload.OffloadConfig (tier,
        optim_frac, swap_dir, ...), validated now so bad numbers fail here.
        step_in_backward (megalith_zero.ZeroConfig's): None updates chunks during
        backward whenever the plugin neither clips (max_norm 0) nor scales the loss
        (precision not fp16)."""
        self.strategy = self.strategy.replace(
            offload=_offload_config(type(self).__name__, **kwargs),
            step_in_backward=step_in_backward,
        )

    def zero_config(self) -> Any:
        return self.strategy.zero_config()

    def configure(self, model, optimizer, criterion, dataloader, lr_scheduler):
        zero = require("megalith_zero", "megalith-zero", type(self).__name__)
        # boost(model) alone (inference, saving, loading, as ColossalAI allows): sharded
        # as for training under an SGD at lr 0, which has no states; no optimizer comes back.
        inference = optimizer is None
        if inference:
            optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
        if isinstance(optimizer, OptimizerWrapper):
            raise ValueError(
                f"{type(self).__name__}: boost() got an optimizer boosted already; pass the "
                "torch optimizer built on the model's parameters"
            )
        w = world()
        source = None
        pending = take_pending_load(model)  # booster.load_model before boost
        if self.materializes_per_chunk() and (is_lazy(model) or pending is not None):
            # Materialised (or read from the checkpoint) a chunk at a time inside shard(),
            # each rank keeping its slice: no rank holds the whole model (megalith.lazy.chunks).
            kwargs = {"checkpoint": pending.directory, "strict": pending.strict} if pending else {}
            source = ChunkMaterializer(model, w.device, **kwargs)
        else:
            model = model.to(w.device)
        cast_buffers(model, self.precision)
        mesh, parallel, layout = None, None, None
        if self.tp_size > 1:
            from .gemini_tp import shard_tensor_parallel

            mesh, parallel = shard_tensor_parallel(
                model, optimizer, self.tp_size, self.extra_dp_size
            )
        kw = dict(mesh=mesh, axis="dp", model_parallel=parallel) if mesh is not None else {}
        config = _cpu_auto_budget(self.zero_config(), w.device)
        if source is not None:
            kw["materialize"] = source
        try:
            zmodel, zopt = zero.shard(model, optimizer, config, **kw)
        finally:
            if source is not None:
                source.close()
        if mesh is not None:
            from ..checkpoint_io.tp_layout import tp_layout

            layout = tp_layout(zmodel)
        wrapped = self.model_class(zmodel, self.force_outputs_fp32, layout)
        boosted = self.optimizer_class.boosted(zopt, wrapped, self.max_norm, self.only_rank_0)
        return (
            wrapped,
            None if inference else boosted,
            criterion,
            dataloader,
            lr_scheduler,
        )

    def materializes_per_chunk(self) -> bool:
        """boost() leaves a LazyInitContext model lazy for this plugin, which materialises
        it one chunk at a time as it shards it (tensor parallelism splits whole tensors
        first, so tp_size > 1 materialises the whole model)."""
        return self.tp_size == 1

    def no_sync(self, model: Any, optimizer: Any) -> contextlib.AbstractContextManager:
        if optimizer is None:
            raise ValueError(
                f"{type(self).__name__}: no_sync needs the boosted optimizer (no_sync(model, optimizer))"
            )
        return optimizer.no_sync()

    def get_checkpoint_io(self) -> CheckpointIO:
        """megalith_zero's full checkpoints, gathered chunk by chunk (tensor-parallel
        shards made whole: the files are the tp = 1 run's)."""
        from .. import checkpoint_io
        from ..checkpoint_io.tp_layout import tp_layout

        io_class = getattr(checkpoint_io, self.checkpoint_io_name)
        return io_class(tp_layout if self.tp_size > 1 else None)


def _cpu_auto_budget(config: Any, device: torch.device) -> Any:
    """On CPU ranks the device is the host: auto placement with no device_budget_bytes
    gets this rank's share of the host's physical memory (warned once), so ColossalAI's
    scripts with placement_policy="auto" run unchanged; set_offload(placement="auto",
    device_budget_bytes=...) simulates a smaller device."""
    offload = config.offload
    if device.type == "cuda" or offload is None or offload.placement != "auto":
        return config
    if offload.device_budget_bytes is not None:
        return config
    import dataclasses
    import os
    import warnings

    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    share = total // max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    warnings.warn(
        f"placement_policy='auto' on CPU ranks: the device is the host, so auto "
        f"placement's budget is {share / 2**30:.1f} GiB per rank (the host's memory over "
        "LOCAL_WORLD_SIZE); plugin.set_offload(placement='auto', device_budget_bytes=...) "
        "simulates a smaller device",
        stacklevel=4,
    )
    offload = dataclasses.replace(offload, device_budget_bytes=share)
    return dataclasses.replace(config, offload=offload)


def _offload_config(owner: str, **kwargs: Any) -> Any:
    mo = require("megalith_offload", "megalith-offload", owner + " offloading")
    return mo.OffloadConfig(**kwargs)


class LowLevelZeroPlugin(_ZeroPlugin):
    """ZeRO stage 1 or 2 (ColossalAI's arguments). cpu_offload=True keeps every fp32
    master and optimizer state in host memory (megalith-offload), stepped there by the
    engine's CPU kernel. overlap_allgather=True leaves the parameter all-gathers after a
    step to the next forward's modules (megalith_zero's overlap_param_gather).
    Floating-point inputs are cast to the working dtype (cast_inputs=True)."""

    runs = ("zero1", "zero2")

    def __init__(
        self,
        stage: int = 1,
        precision: str = "fp16",
        initial_scale: float = 2**32,
        min_scale: float = 1,
        growth_factor: float = 2,
        backoff_factor: float = 0.5,
        growth_interval: int = 1000,
        hysteresis: int = 2,
        max_scale: float = 2**32,
        max_norm: float = 0.0,
        norm_type: float = 2.0,
        reduce_bucket_size_in_m: int = 12,
        communication_dtype: torch.dtype | None = None,
        overlap_communication: bool = True,
        overlap_allgather: bool = False,
        cpu_offload: bool = False,
        master_weights: bool = True,
        verbose: bool = False,
        cast_inputs: bool = True,
        fp8_communication: bool = False,
        use_fp8: bool = False,
        extra_dp_size: int = 1,
    ) -> None:
        owner = "LowLevelZeroPlugin"
        if stage not in (1, 2):
            raise ValueError(f"{owner}: stage={stage}; expected 1 or 2 (stage 3 is GeminiPlugin)")
        precision = check_precision(owner, precision)
        _check_common(owner, precision, norm_type, master_weights)
        if not cast_inputs and precision != "fp32":
            raise ValueError(
                f"{owner}: cast_inputs=False; megalith's ZeRO model casts floating-point "
                "inputs to the working dtype: pass cast_inputs=True (and cast inside the "
                "model what must stay fp32)"
            )
        warn_non_defaults(
            owner,
            dict(
                verbose=verbose,
                fp8_communication=fp8_communication,
                use_fp8=use_fp8,
                extra_dp_size=extra_dp_size,
            ),
            dict(
                verbose=(False, "megalith prints no ZeRO debug information"),
                fp8_communication=(False, _FP8),
                use_fp8=(False, _FP8),
                extra_dp_size=(1, _EXTRA_DP),
            ),
        )
        offload = None
        if cpu_offload:
            offload = _offload_config(owner, tier="host", optim_frac=1.0)
        super().__init__(
            Strategy(
                plugin=f"zero{stage}",
                precision=precision,
                offload=offload,
                loss_scale=colossal_loss_scale(
                    initial_scale=initial_scale,
                    min_scale=min_scale,
                    growth_factor=growth_factor,
                    backoff_factor=backoff_factor,
                    growth_interval=growth_interval,
                    hysteresis=hysteresis,
                    max_scale=max_scale,
                ),
                max_norm=max_norm,
                zero=ZeroTuning(
                    chunk_bytes=reduce_bucket_size_in_m << 20,
                    reduce_dtype=communication_dtype,
                    overlap=overlap_communication,
                    overlap_param_gather=overlap_allgather,
                ),
            )
        )

    def support_no_sync(self) -> bool:
        return True

    def support_lora(self) -> bool:
        return True


def _chunk_bytes(chunk_config_dict: dict | None, precision: str) -> tuple[int, bool]:
    """(chunk bytes, keep_gathered) of ColossalAI's chunk_config_dict: {dp size:
    {"chunk_size": elements, "keep_gathered": bool}} (any one entry: megalith's chunks
    are the same at every size), or {"chunk_size": elements}; (0, False): search."""
    if not chunk_config_dict:
        return 0, False
    entry = chunk_config_dict
    if "chunk_size" not in entry:
        entry = next(iter(chunk_config_dict.values()))
    if not isinstance(entry, dict) or "chunk_size" not in entry:
        raise ValueError(
            f"GeminiPlugin: chunk_config_dict={chunk_config_dict!r}; expected {{dp_size: "
            "{'chunk_size': elements, 'keep_gathered': bool}} (or None to search)"
        )
    element = 2 if precision in _HALF else 4
    return int(entry["chunk_size"]) * element, bool(entry.get("keep_gathered", False))


class GeminiPlugin(_ZeroPlugin):
    """ZeRO stage 3 over chunks (ColossalAI's arguments). offload_optim_frac keeps that
    fraction of the chunks' fp32 masters and optimizer states in host memory
    (megalith-offload). placement_policy="auto": the first step runs with every chunk's
    masters and states on the host while it measures the step's device memory, then
    the chunks that fit under steady_cuda_cap_ratio of the device move back to it
    (megalith_offload's auto placement; on CPU ranks the device is the host, its memory
    shared by the local ranks, unless set_offload(placement="auto",
    device_budget_bytes=...) simulates a smaller one). offload_param_frac keeps
    that fraction of the chunks' parameter shards in host memory (at most
    offload_optim_frac: the host kernel writes them). Gradients accumulate over the
    backward passes between two steps (enable_gradient_accumulation is always on;
    with offload, passing it True keeps the host update after backward, see zero_config).
    The boosted model's state_dict(only_rank_0=True) is the full one, on rank 0."""

    runs = ("gemini",)
    only_rank_0 = True
    model_class = GeminiDDP
    optimizer_class = GeminiOptimizer
    checkpoint_io_name = "GeminiCheckpointIO"

    def support_lora(self) -> bool:
        """Frozen base weights go to chunks without masters or states (stage 3 shards
        them like the rest); only the adapters' chunks step."""
        return True

    enable_lora = LowLevelZeroPlugin.enable_lora

    def __init__(
        self,
        chunk_config_dict: dict | None = None,
        chunk_init_device: Any = None,
        placement_policy: str = "static",
        enable_gradient_accumulation: bool = False,
        max_prefetch: int = 0,
        shard_param_frac: float = 1.0,
        offload_optim_frac: float = 0.0,
        offload_param_frac: float = 0.0,
        warmup_non_model_data_ratio: float = 0.8,
        steady_cuda_cap_ratio: float = 0.9,
        precision: str = "fp16",
        master_weights: bool = True,
        pin_memory: bool = False,
        force_outputs_fp32: bool = False,
        strict_ddp_mode: bool = False,
        search_range_m: int = 32,
        hidden_dim: int | None = None,
        min_chunk_size_m: float = 32,
        memstats: Any = None,
        gpu_margin_mem_ratio: float = 0.0,
        initial_scale: float = 2**16,
        min_scale: float = 1,
        growth_factor: float = 2,
        backoff_factor: float = 0.5,
        growth_interval: int = 1000,
        hysteresis: int = 2,
        max_scale: float = 2**32,
        max_norm: float = 0.0,
        norm_type: float = 2.0,
        tp_size: int = 1,
        extra_dp_size: int = 1,
        enable_all_optimization: bool = False,
        enable_fused_normalization: bool = False,
        enable_flash_attention: bool = False,
        enable_sequence_parallelism: bool = False,
        enable_jit_fused: bool = False,
        enable_sequence_overlap: bool = False,
        enable_async_reduce: bool = True,
        use_fp8: bool = False,
        verbose: bool = False,
        fp8_communication: bool = False,
    ) -> None:
        owner = "GeminiPlugin"
        precision = check_precision(owner, precision)
        _check_common(owner, precision, norm_type, master_weights)
        if placement_policy not in ("static", "auto"):
            raise ValueError(
                f"{owner}: placement_policy={placement_policy!r}; expected 'static' or 'auto'"
            )
        if not 0.0 < steady_cuda_cap_ratio <= 1.0:
            raise ValueError(
                f"{owner}: steady_cuda_cap_ratio={steady_cuda_cap_ratio}; the fraction of "
                "the device's memory auto placement may fill, in (0, 1]"
            )
        if not 0.0 <= shard_param_frac <= 1.0:
            raise ValueError(f"{owner}: shard_param_frac={shard_param_frac}; expected in [0, 1]")
        if isinstance(tp_size, bool) or not isinstance(tp_size, int) or tp_size < 1:
            raise ValueError(f"{owner}: tp_size={tp_size!r}; expected an int >= 1")
        if (
            isinstance(extra_dp_size, bool)
            or not isinstance(extra_dp_size, int)
            or extra_dp_size < 1
        ):
            raise ValueError(f"{owner}: extra_dp_size={extra_dp_size!r}; expected an int >= 1")
        self.tp_size, self.extra_dp_size = tp_size, extra_dp_size
        chunk_bytes, keep_gathered = _chunk_bytes(chunk_config_dict, precision)
        self._warn_ignored(
            dict(
                chunk_init_device=chunk_init_device,
                keep_gathered=keep_gathered,
                max_prefetch=max_prefetch,
                shard_param_frac=shard_param_frac,
                warmup_non_model_data_ratio=warmup_non_model_data_ratio,
                strict_ddp_mode=strict_ddp_mode,
                search_range_m=search_range_m,
                hidden_dim=hidden_dim,
                min_chunk_size_m=min_chunk_size_m,
                memstats=memstats,
                gpu_margin_mem_ratio=gpu_margin_mem_ratio,
                extra_dp_size=extra_dp_size,
                enable_all_optimization=enable_all_optimization,
                enable_fused_normalization=enable_fused_normalization,
                enable_flash_attention=enable_flash_attention,
                enable_jit_fused=enable_jit_fused,
                enable_sequence_overlap=enable_sequence_overlap,
                use_fp8=use_fp8,
                verbose=verbose,
                fp8_communication=fp8_communication,
            )
        )
        self.enable_gradient_accumulation = enable_gradient_accumulation
        self.pin_memory = pin_memory  # megalith's host state is always pinned
        self.force_outputs_fp32 = force_outputs_fp32
        offload = _gemini_offload(
            placement_policy, offload_optim_frac, offload_param_frac, steady_cuda_cap_ratio
        )
        super().__init__(
            Strategy(
                plugin="gemini",
                precision=precision,
                offload=offload,
                loss_scale=colossal_loss_scale(
                    initial_scale=initial_scale,
                    min_scale=min_scale,
                    growth_factor=growth_factor,
                    backoff_factor=backoff_factor,
                    growth_interval=growth_interval,
                    hysteresis=hysteresis,
                    max_scale=max_scale,
                ),
                max_norm=max_norm,
                zero=ZeroTuning(chunk_bytes=chunk_bytes, overlap=enable_async_reduce),
            )
        )

    def zero_config(self) -> Any:
        """enable_gradient_accumulation=True says several plain backwards precede each
        step (ColossalAI's pattern), so offloaded chunks are not updated during backward
        unless set_offload(step_in_backward=True) asks (then all micro-batches but the
        last go under booster.no_sync and the host update overlaps the last backward)."""
        strategy = self.strategy
        if self.enable_gradient_accumulation and strategy.step_in_backward is None:
            strategy = strategy.replace(step_in_backward=False)
        return strategy.zero_config()

    def _default_options(self) -> None:
        self.enable_gradient_accumulation = False
        self.pin_memory = False
        self.force_outputs_fp32 = False

    @staticmethod
    def _warn_ignored(given: dict[str, Any]) -> None:
        chunks = "megalith sizes its chunks itself (chunk_config_dict's chunk_size sets it)"
        kernels = "megalith runs the model's own modules (no Shardformer kernel swaps)"
        auto = "megalith's auto placement measures the step itself"
        warn_non_defaults(
            "GeminiPlugin",
            given,
            dict(
                chunk_init_device=(None, "chunks are built on each rank's device"),
                keep_gathered=(False, "megalith shards every chunk at stage 3"),
                max_prefetch=(0, "megalith gathers the next chunk ahead itself"),
                shard_param_frac=(
                    1.0,
                    "megalith shards every chunk at stage 3; keeping some whole only "
                    "trades memory for communication",
                ),
                warmup_non_model_data_ratio=(0.8, auto),
                strict_ddp_mode=(False, chunks),
                search_range_m=(32, chunks),
                hidden_dim=(None, chunks),
                min_chunk_size_m=(32, chunks),
                memstats=(None, auto),
                gpu_margin_mem_ratio=(0.0, auto),
                extra_dp_size=(1, _EXTRA_DP),
                enable_all_optimization=(False, kernels),
                enable_fused_normalization=(False, kernels),
                enable_flash_attention=(False, kernels),
                enable_jit_fused=(False, kernels),
                enable_sequence_overlap=(False, "sequence parallelism needs tp_size > 1"),
                use_fp8=(False, _FP8),
                verbose=(False, "megalith prints no chunk search information"),
                fp8_communication=(False, _FP8),
            ),
        )

    def support_no_sync(self) -> bool:
        return False


def _gemini_offload(
    placement_policy: str,
    offload_optim_frac: float,
    offload_param_frac: float,
    steady_cuda_cap_ratio: float,
) -> Any:
    """The OffloadConfig of Gemini's placement arguments, or None."""
    if placement_policy == "auto":
        if offload_optim_frac:
            raise ValueError(
                f"GeminiPlugin: offload_optim_frac={offload_optim_frac} with "
                "placement_policy='auto'; auto placement decides the fraction itself "
                "(leave offload_optim_frac at 0.0, or use placement_policy='static')"
            )
        if offload_param_frac:
            raise ValueError(
                f"GeminiPlugin: offload_param_frac={offload_param_frac} with "
                "placement_policy='auto'; auto placement decides which parameter "
                "shards leave the GPU itself (leave offload_param_frac at 0.0, or use "
                "placement_policy='static' to choose it)"
            )
        return _offload_config(
            "GeminiPlugin",
            tier="host",
            optim_frac=1.0,
            placement="auto",
            headroom=1.0 - steady_cuda_cap_ratio,
        )
    if not (offload_optim_frac or offload_param_frac):
        return None
    if offload_param_frac > offload_optim_frac:
        raise ValueError(
            f"GeminiPlugin: offload_param_frac={offload_param_frac} > offload_optim_frac="
            f"{offload_optim_frac}; a chunk's parameters can live in host memory only "
            "where its optimizer states do (the host kernel writes them): raise "
            "offload_optim_frac to at least offload_param_frac"
        )
    return _offload_config(
        "GeminiPlugin",
        tier="host",
        optim_frac=offload_optim_frac,
        param_frac=offload_param_frac,
    )
