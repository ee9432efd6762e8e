"""Strategy: the whole parallel configuration of a run, in one frozen object.

`megalith train`, `megalith plan` and the Booster's built-in plugins are all made from
one (Strategy.from_cli, Strategy.make_plugin; the plugins' ColossalAI arguments become
one in their constructors), and megalith_zero's ZeroConfig is made from it in one place,
Strategy.zero_config. A Strategy checks itself on construction, so a bad combination
fails on every rank before any collective, with the fix in the message.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from megalith_core.loss_scale import LossScaleConfig

from .loss_scale import default_loss_scale

if TYPE_CHECKING:
    import argparse

    from megalith.booster.plugin.base import Plugin
    from megalith.booster.plugin.hybrid_pipeline import PipelineSettings
    from megalith_offload import OffloadConfig
    from megalith_zero import ZeroConfig

PLUGINS = ("ddp", "zero1", "zero2", "gemini", "hybrid")
PRECISIONS = ("fp32", "fp16", "bf16")
SEQUENCE_PARALLELISM = (None, "split_gather", "all_to_all")
#: the ZeRO stage each plugin runs (hybrid's is its own field: 0, 1 or 2)
PLUGIN_STAGE = {"ddp": 0, "zero1": 1, "zero2": 2, "gemini": 3}
#: the plugin of each ZeRO stage
STAGE_PLUGIN = {1: "zero1", 2: "zero2", 3: "gemini"}
_ZERO_PLUGINS = ("zero1", "zero2", "gemini")
#: LowLevelZeroPlugin's reduce_bucket_size_in_m=12; the others let the engine search
_DEFAULT_CHUNK_BYTES = {"zero1": 12 << 20, "zero2": 12 << 20}
#: Parallel's pipeline fields at their defaults: (pp, pp_style, num_model_chunks,
#: num_microbatches, microbatch_size)
_NO_PIPELINE = (1, "1f1b", 1, None, None)


def _positive_int(owner: str, name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{owner}: {name}={value!r}; expected an int >= 1")


@dataclass(frozen=True)
class Parallel:
    """Model parallelism (HybridParallelPlugin): tensor, pipeline and sequence parallel
    sizes, and the pipeline's schedule and micro-batches.

    sequence_parallelism: None; "split_gather" (Megatron style, over the tp group, so sp
        stays 1); or "all_to_all" (Ulysses, over an sp axis of its own, sp >= 2).
    pp_style, num_model_chunks, num_microbatches, microbatch_size: ColossalAI's pipeline
        settings; with pp > 1 exactly one of num_microbatches and microbatch_size.
    """

    tp: int = 1
    pp: int = 1
    sp: int = 1
    sequence_parallelism: str | None = None
    pp_style: str = "1f1b"
    num_model_chunks: int = 1
    num_microbatches: int | None = None
    microbatch_size: int | None = None

    def __post_init__(self) -> None:
        for name in ("tp", "pp", "sp"):
            _positive_int("Parallel", name, getattr(self, name))
        mode = self.sequence_parallelism
        if mode not in SEQUENCE_PARALLELISM:
            raise ValueError(
                f"Parallel: sequence_parallelism={mode!r}; expected None, 'split_gather' "
                "(over the tp group) or 'all_to_all' (Ulysses, over an sp axis)"
            )
        if mode == "all_to_all" and self.sp < 2:
            raise ValueError(
                f"Parallel: sequence_parallelism='all_to_all' with sp={self.sp}; give the "
                "sequence axis's size, sp >= 2 (it runs beside tp: world = dp x sp x tp)"
            )
        if self.sp > 1 and mode != "all_to_all":
            raise ValueError(
                f"Parallel: sp={self.sp} with sequence_parallelism={mode!r}; an sp axis of its "
                "own is sequence_parallelism='all_to_all' (split_gather runs over the tp group)"
            )
        if self._pipeline_fields() != _NO_PIPELINE:
            self.pipeline_settings()  # checks the schedule and the micro-batches

    def _pipeline_fields(self) -> tuple[Any, ...]:
        return (
            self.pp,
            self.pp_style,
            self.num_model_chunks,
            self.num_microbatches,
            self.microbatch_size,
        )

    def pipeline_settings(self) -> PipelineSettings:
        """The pipeline's schedule and micro-batches, as HybridParallelPlugin runs them."""
        from megalith.booster.plugin.hybrid_pipeline import PipelineSettings

        return PipelineSettings.check(
            pp_size=self.pp,
            pp_style=self.pp_style,
            num_model_chunks=self.num_model_chunks,
            num_microbatches=self.num_microbatches,
            microbatch_size=self.microbatch_size,
        )

    @property
    def size(self) -> int:
        """Ranks of one data-parallel replica: tp x pp x sp."""
        return self.tp * self.pp * self.sp


@dataclass(frozen=True)
class ZeroTuning:
    """How ZeRO reduces and gathers (megalith_zero.ZeroConfig's fields of the same names):
    chunk_bytes 0 lets the engine search the chunk size, None takes the plugin's default
    (12 MiB for zero1 and zero2, ColossalAI's reduce bucket; 0 otherwise); reduce_dtype
    None reduces in the working dtype; overlap_param_gather (stages 1 and 2) leaves the
    all-gathers after a step to the next forward (ColossalAI's overlap_allgather)."""

    chunk_bytes: int | None = None
    reduce_dtype: Any = None
    overlap: bool = True
    overlap_param_gather: bool = False

    def __post_init__(self) -> None:
        size = self.chunk_bytes
        if size is not None and (isinstance(size, bool) or not isinstance(size, int) or size < 0):
            raise ValueError(
                f"ZeroTuning: chunk_bytes={size!r}; expected None (the plugin's default) or an "
                "int >= 0 (0: the engine's search)"
            )


@dataclass(frozen=True)
class Strategy:
    """How a run is parallelised, in which precision, where its state lives.

    plugin: "ddp" (torch DDP), "zero1", "zero2" (LowLevelZeroPlugin), "gemini" (ZeRO
        stage 3) or "hybrid" (HybridParallelPlugin: tp x pp x sp x dp).
    zero_stage: None takes the plugin's (ddp 0, zero1 1, zero2 2, gemini 3, hybrid 0);
        hybrid runs 0, 1 or 2.
    precision: "fp32", "bf16" or "fp16".
    parallel: tp / pp / sp sizes and micro-batches (hybrid only).
    offload: a megalith_offload.OffloadConfig (ZeRO plugins), or None.
    loss_scale: fp16's dynamic loss scale; None takes the plugin's default (torch's
        GradScaler for ddp, ColossalAI's for the others).
    max_norm: clip gradients to this global L2 norm at every step; 0: no clipping.
    step_in_backward: update offloaded chunks during backward; None: exactly when
        nothing clips or scales (ZeRO plugins with offload).
    zero: ZeRO's chunk size, reduction dtype and overlap.

    Frozen: change one with `strategy.replace(...)`, which checks the result again.
    """

    plugin: str = "ddp"
    zero_stage: int | None = None
    precision: str = "fp32"
    parallel: Parallel = field(default_factory=Parallel)
    offload: OffloadConfig | None = None
    loss_scale: LossScaleConfig | None = None
    max_norm: float = 0.0
    step_in_backward: bool | None = None
    zero: ZeroTuning = field(default_factory=ZeroTuning)

    def __post_init__(self) -> None:
        if self.plugin not in PLUGINS:
            hint = " (ZeRO stage 3 is 'gemini')" if self.plugin == "zero3" else ""
            raise ValueError(
                f"Strategy: plugin={self.plugin!r}; expected one of {', '.join(PLUGINS)}{hint}"
            )
        if self.precision not in PRECISIONS:
            raise ValueError(
                f"Strategy: precision={self.precision!r}; expected one of {', '.join(PRECISIONS)}"
            )
        for name, kind in (("parallel", Parallel), ("zero", ZeroTuning)):
            if not isinstance(getattr(self, name), kind):
                raise ValueError(
                    f"Strategy: {name}={getattr(self, name)!r}; expected a {kind.__name__}"
                )
        object.__setattr__(self, "zero_stage", self._checked_stage())
        if self.parallel != Parallel() and self.plugin != "hybrid":
            raise ValueError(
                f"Strategy: {self.parallel} with plugin={self.plugin!r}; tensor, pipeline and "
                "sequence parallelism run in plugin='hybrid'"
            )
        self._check_loss_scale()
        norm = self.max_norm
        if isinstance(norm, bool) or not isinstance(norm, (int, float)) or not norm >= 0:
            raise ValueError(f"Strategy: max_norm={norm!r}; expected >= 0 (0: no clipping)")
        if not math.isfinite(norm):
            raise ValueError(
                f"Strategy: max_norm={norm!r}; expected a finite norm (0: no clipping)"
            )
        self._check_offload()
        self._check_zero()

    def _checked_stage(self) -> int:
        stage = self.zero_stage
        if self.plugin == "hybrid":
            if stage is None:
                return 0
            if stage not in (0, 1, 2):
                raise ValueError(
                    f"Strategy: zero_stage={stage!r} with plugin='hybrid'; expected 0, 1 or 2 "
                    "(stage 3 with tensor parallelism is not built yet: plugin='gemini' runs "
                    "stage 3 without tp)"
                )
            return stage
        own = PLUGIN_STAGE[self.plugin]
        if stage is not None and stage != own:
            fix = f"plugin={STAGE_PLUGIN[stage]!r}" if stage in STAGE_PLUGIN else "zero_stage=None"
            raise ValueError(
                f"Strategy: zero_stage={stage!r} with plugin={self.plugin!r}, which runs stage "
                f"{own}; use {fix} (or leave zero_stage out)"
            )
        return own

    def _check_loss_scale(self) -> None:
        if self.loss_scale is None:
            object.__setattr__(self, "loss_scale", default_loss_scale(self.plugin))
        elif not isinstance(self.loss_scale, LossScaleConfig):
            raise ValueError(
                f"Strategy: loss_scale={self.loss_scale!r}; expected None or a "
                "megalith_core.loss_scale.LossScaleConfig"
            )
        elif self.plugin == "ddp" and self.loss_scale != default_loss_scale("ddp"):
            raise ValueError(
                "Strategy: loss_scale with plugin='ddp', which scales fp16 losses with torch's "
                "GradScaler at its defaults; leave loss_scale out, or use a ZeRO or hybrid plugin"
            )

    def _check_offload(self) -> None:
        offload = self.offload
        if offload is None:
            return
        if not (hasattr(offload, "tier") and hasattr(offload, "optim_frac")):
            raise ValueError(
                f"Strategy: offload={offload!r}; expected None or a "
                "megalith_offload.OffloadConfig (e.g. OffloadConfig(tier='host'))"
            )
        if self.zero_stage == 0:
            fix = "zero_stage=1 or 2" if self.plugin == "hybrid" else "plugin='zero2'"
            raise ValueError(
                f"Strategy: offload with plugin={self.plugin!r} at ZeRO stage 0; offloading "
                f"moves ZeRO's sharded masters and optimizer states: use {fix}"
            )
        if offload.param_frac and self.zero_stage != 3:
            raise ValueError(
                f"Strategy: offload param_frac={offload.param_frac} at ZeRO stage "
                f"{self.zero_stage}, where every rank keeps all parameters; parameter shards "
                "are offloaded at stage 3: use plugin='gemini', or param_frac=0"
            )
        if self.plugin == "hybrid" and (offload.tier, offload.placement, offload.optim_frac) != (
            "host",
            "static",
            1.0,
        ):
            raise ValueError(
                f"Strategy: plugin='hybrid' with offload tier={offload.tier!r}, placement="
                f"{offload.placement!r}, optim_frac={offload.optim_frac}; the hybrid plugin "
                "offloads every chunk to host memory (cpu_offload): use OffloadConfig(tier='host')"
            )

    def _check_zero(self) -> None:
        if self.zero_stage == 0 and self.zero not in (ZeroTuning(), ZeroTuning(chunk_bytes=0)):
            raise ValueError(
                f"Strategy: zero={self.zero} with plugin={self.plugin!r} at ZeRO stage 0, which "
                "has no chunks to tune; leave zero out, or use a ZeRO plugin"
            )
        if self.zero.chunk_bytes is None:
            chunk = _DEFAULT_CHUNK_BYTES.get(self.plugin, 0)
            object.__setattr__(self, "zero", dataclasses.replace(self.zero, chunk_bytes=chunk))
        if self.zero.overlap_param_gather and self.zero_stage == 3:
            raise ValueError(
                "Strategy: overlap_param_gather at ZeRO stage 3, which already gathers each "
                "module's parameters just before it runs; use it with zero1 or zero2"
            )
        if self.step_in_backward and self.zero_stage == 0:
            raise ValueError(
                f"Strategy: step_in_backward=True with plugin={self.plugin!r} at ZeRO stage 0; "
                "updating chunks during backward is ZeRO's: use a ZeRO plugin"
            )

    # -- what is made from it ---------------------------------------------------------
    @classmethod
    def from_cli(cls, args: argparse.Namespace, **defaults: Any) -> Strategy:
        """The Strategy of `megalith train` / `megalith plan` options (megalith.cli.options);
        see megalith.strategy.from_cli.strategy_from_args for `defaults`."""
        from .from_cli import strategy_from_args

        return strategy_from_args(args, **defaults)

    def replace(self, **changes: Any) -> Strategy:
        """A copy with `changes`, checked again. A new plugin brings its own ZeRO stage,
        and its own loss scale and chunk size where this one had the old plugin's."""
        plugin = changes.get("plugin", self.plugin)
        if plugin != self.plugin:
            changes.setdefault("zero_stage", None)
            if self.loss_scale == default_loss_scale(self.plugin):
                changes.setdefault("loss_scale", None)
            if self.zero.chunk_bytes == _DEFAULT_CHUNK_BYTES.get(self.plugin, 0):
                changes.setdefault("zero", dataclasses.replace(self.zero, chunk_bytes=None))
        return dataclasses.replace(self, **changes)

    def dp_size(self, world_size: int) -> int:
        """The data-parallel ranks at this world size: world / (tp x pp x sp), whole."""
        p = self.parallel
        if world_size < 1 or world_size % p.size:
            raise ValueError(
                f"Strategy: world size {world_size} is not divisible by tp_size {p.tp} * "
                f"sp_size {p.sp} * pp_size {p.pp} = {p.size}; dp = world size / {p.size} must "
                f"be whole: run a multiple of {p.size} ranks, or make tp, pp or sp smaller"
            )
        return world_size // p.size

    @property
    def updates_in_backward(self) -> bool:
        """Whether ZeRO updates chunks as backward reduces their gradients."""
        if self.step_in_backward is not None:
            return self.step_in_backward
        return (
            self.plugin in _ZERO_PLUGINS
            and self.offload is not None
            and not self.max_norm
            and self.precision != "fp16"
        )

    def zero_config(self) -> ZeroConfig:
        """megalith_zero's configuration of this strategy (the roof's only ZeroConfig)."""
        if self.zero_stage == 0:
            raise ValueError(
                f"Strategy: plugin={self.plugin!r} at ZeRO stage 0 shards nothing, so it has no "
                "ZeroConfig; use zero1, zero2, gemini, or hybrid with zero_stage 1 or 2"
            )
        from megalith.booster.plugin.base import require

        zero = require("megalith_zero", "megalith-zero", f"Strategy(plugin={self.plugin!r})")
        # Under a pipeline bf16 and fp16 are torch.autocast over fp32 parameters and
        # masters; fp16 still scales the loss.
        pipelined = self.parallel.pp > 1
        return zero.ZeroConfig(
            stage=self.zero_stage,
            precision="fp32" if pipelined else self.precision,
            reduce_dtype=self.zero.reduce_dtype,
            chunk_bytes=self.zero.chunk_bytes,
            loss_scale=self.loss_scale,
            loss_scaling=self.precision == "fp16" if pipelined else None,
            overlap=self.zero.overlap,
            offload=self.offload,
            step_in_backward=self.updates_in_backward,
            overlap_param_gather=self.zero.overlap_param_gather,
            # LowLevelZero's layout: a rank's shard of every parameter is its equal slice,
            # as ColossalAI's LowLevelZeroOptimizer exposes it
            shard_each_param=self.plugin in ("zero1", "zero2"),
        )

    def make_plugin(self) -> Plugin:
        """The Booster plugin that runs this strategy."""
        from megalith.booster.plugin import (
            GeminiPlugin,
            HybridParallelPlugin,
            LowLevelZeroPlugin,
            TorchDDPPlugin,
        )

        kinds = {
            "ddp": TorchDDPPlugin,
            "zero1": LowLevelZeroPlugin,
            "zero2": LowLevelZeroPlugin,
            "gemini": GeminiPlugin,
            "hybrid": HybridParallelPlugin,
        }
        return kinds[self.plugin].from_strategy(self)
