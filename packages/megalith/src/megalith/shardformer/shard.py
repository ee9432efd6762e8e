"""ShardConfig and ShardFormer: ColossalAI's way to shard a model outside a plugin.

`ShardFormer(ShardConfig(tensor_parallel_process_group=g)).optimize(model)` shards the
model in place with megalith's policy for its family (megalith.tensor_parallel.SUPPORTED)
and returns (model, shared_params); shared_params is empty, as pipeline stages are the
plugin's business here. Arguments that only tune speed are ignored with a warning;
pipeline stages and all-to-all sequence parallelism are refused, naming the plugin
that does them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from torch import nn

from .layer.groups import comm_group
from .layer.options import warn_once

_PERFORMANCE_ONLY = (
    "enable_all_optimization", "enable_fused_normalization", "enable_flash_attention",
    "enable_jit_fused", "enable_sequence_overlap",
)  # fmt: skip


@dataclass
class GradientCheckpointConfig:
    gradient_checkpointing_ratio: float = 0.0


@dataclass
class PipelineGradientCheckpointConfig(GradientCheckpointConfig):
    num_stages: int | None = None
    num_model_chunks: int | None = None
    num_model_layers: int | None = None
    num_layers_per_stage: list[int] | None = None
    num_ckpt_layers_per_stage: list[int] | None = None


@dataclass
class ShardConfig:
    tensor_parallel_process_group: Any = None
    sequence_parallel_process_group: Any = None
    pipeline_stage_manager: Any = None
    enable_tensor_parallelism: bool = True
    enable_all_optimization: bool = False
    enable_fused_normalization: bool = False
    enable_flash_attention: bool = False
    enable_jit_fused: bool = False
    enable_sequence_parallelism: bool = False
    sequence_parallelism_mode: str | None = None
    enable_sequence_overlap: bool = False
    parallel_output: bool = True
    make_vocab_size_divisible_by: int = 64
    gradient_checkpoint_config: GradientCheckpointConfig | None = None
    extra_kwargs: dict[str, Any] = field(default_factory=dict)
    sp_axis: int | None = None
    pg_mesh: Any = None
    inner_ring_size: int | None = None
    moe_dp_group: Any = None
    ep_group: Any = None
    fp8_communication: bool = False

    @property
    def tensor_parallel_size(self) -> int:
        if not self.enable_tensor_parallelism:
            return 1
        return comm_group(self.tensor_parallel_process_group, "ShardConfig").size

    @property
    def sequence_parallel_size(self) -> int:
        if self.sequence_parallel_process_group is None:
            return 1
        return comm_group(self.sequence_parallel_process_group, "ShardConfig").size


class ShardFormer:
    def __init__(self, shard_config: ShardConfig) -> None:
        self.shard_config = shard_config

    def optimize(self, model: nn.Module, policy: Any = None) -> tuple[nn.Module, list]:
        cfg = self.shard_config
        _check(cfg)
        if not cfg.enable_tensor_parallelism:
            return model, []
        from ..tensor_parallel import Policy, shard_model

        if policy is not None and not isinstance(policy, Policy):
            raise TypeError(
                f"ShardFormer.optimize: policy {type(policy).__name__} is a ColossalAI policy; "
                "pass a megalith.tensor_parallel.Policy subclass, or none for the built-in one"
            )
        group = comm_group(cfg.tensor_parallel_process_group, "ShardFormer")
        sequence_parallel = cfg.enable_sequence_parallelism
        shard_model(
            model, group, sequence_parallel=sequence_parallel,
            gather_logits=not cfg.parallel_output, policy=policy,
        )  # fmt: skip
        return model, []


def _check(cfg: ShardConfig) -> None:
    if cfg.pipeline_stage_manager is not None:
        raise ValueError(
            "ShardFormer: pipeline_stage_manager is not supported outside a plugin; use "
            "HybridParallelPlugin(pp_size=...) with booster.boost(model, ...)"
        )
    mode = cfg.sequence_parallelism_mode if cfg.enable_sequence_parallelism else None
    if mode not in (None, "split_gather", "ring"):
        raise ValueError(
            f"ShardFormer: sequence_parallelism_mode={mode!r} needs the plugin's attention "
            'hooks; use HybridParallelPlugin(sp_size=..., sequence_parallelism_mode="all_to_all") '
            'or mode "split_gather"'
        )
    if cfg.fp8_communication:
        raise ValueError("ShardFormer: fp8_communication=True is not supported; leave it False")
    if cfg.gradient_checkpoint_config is not None:
        raise ValueError(
            "ShardFormer: gradient_checkpoint_config is honoured by HybridParallelPlugin only; "
            "pass it there, or leave it None"
        )
    for name in _PERFORMANCE_ONLY:
        if getattr(cfg, name, False):
            warn_once(f"shardconfig:{name}", f"ShardConfig: {name} is ignored (performance only)")
