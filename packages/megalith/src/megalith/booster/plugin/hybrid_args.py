"""HybridParallelPlugin's ColossalAI arguments: which megalith honours, which only tune
speed (accepted, warned about once when set), and which it refuses (naming what to pass).

An argument at ColossalAI's default is never warned about or refused. The table:

honoured: tp_size, pp_size, sp_size, precision, zero_stage, enable_sequence_parallelism,
  sequence_parallelism_mode, parallel_output, num_microbatches, microbatch_size, the loss
  scale (initial_scale, min_scale, growth_factor, backoff_factor, growth_interval,
  hysteresis, max_scale), max_norm, broadcast_buffers, cpu_offload, custom_policy,
  pp_style, num_model_chunks, num_layers_per_stage, gradient_checkpoint_config,
  communication_dtype (zero_stage 0 without a pipeline).
speed only (megalith picks its kernels, buckets, overlap and schedule order itself; same
  results): enable_all_optimization, enable_fused_normalization, enable_flash_attention,
  enable_jit_fused, enable_sequence_overlap, overlap_communication, overlap_p2p,
  overlap_allgather, enable_metadata_cache, zero_bucket_size_in_m, ddp_bucket_cap_mb,
  find_unused_parameters, check_reduction, gradient_as_bucket_view, static_graph,
  scheduler_nodes, make_vocab_size_divisible_by, dp_outside, inner_ring_size; the
  sequence_parallelism_mode "ring" (run as "split_gather") and "ring_attn" (as "all_to_all").
refused when set: fp8_communication, use_fp8 (fp8 changes results; use precision="bf16").
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any

import torch

# name -> ColossalAI's default; a value other than it only changes speed.
SPEED_ONLY: dict[str, Any] = {
    "enable_all_optimization": False,
    "enable_fused_normalization": False,
    "enable_flash_attention": False,
    "enable_jit_fused": False,
    "enable_sequence_overlap": False,
    "overlap_communication": True,
    "overlap_p2p": True,
    "overlap_allgather": False,
    "enable_metadata_cache": True,
    "zero_bucket_size_in_m": 12,
    "ddp_bucket_cap_mb": 25,
    "find_unused_parameters": False,
    "check_reduction": False,
    "gradient_as_bucket_view": False,
    "static_graph": False,
    "scheduler_nodes": None,
    "make_vocab_size_divisible_by": 64,
    "dp_outside": True,
    "inner_ring_size": None,
}

WHY = {
    "scheduler_nodes": "megalith_pipeline builds the ZB-V order itself",
    "make_vocab_size_divisible_by": "megalith splits the vocabulary unpadded (tp must divide it)",
    "dp_outside": "megalith places tp fastest, then sp, dp and pp; the results do not change",
    "inner_ring_size": "it tunes ring attention, which megalith runs as all_to_all",
    "find_unused_parameters": "megalith averages the gradients that exist; no graph walk",
}

_warned: set[str] = set()


def warn_once(name: str, why: str) -> None:
    if name in _warned:
        return
    _warned.add(name)
    warnings.warn(f"HybridParallelPlugin: {name} is ignored ({why})", stacklevel=4)


def check_speed_only(values: dict[str, Any]) -> None:
    for name, default in SPEED_ONLY.items():
        value = values.get(name, default)
        if value != default:
            warn_once(name, WHY.get(name, "speed only: megalith picks this itself"))


def refuse_fp8(fp8_communication: bool, use_fp8: bool) -> None:
    if fp8_communication:
        raise NotImplementedError(
            "HybridParallelPlugin: fp8_communication=True is not built (fp8 collectives change "
            "the results); leave fp8_communication=False: megalith communicates in the "
            "working precision"
        )
    if use_fp8:
        raise NotImplementedError(
            "HybridParallelPlugin: use_fp8=True (fp8 matmuls) is not built; use "
            "precision='bf16' or 'fp16'"
        )


@dataclass(frozen=True)
class SequenceSettings:
    """The sequence-parallel mode megalith runs and the sp axis size."""

    mode: str | None  # None, "split_gather", "all_to_all"
    sp: int


def sequence_settings(
    enable: bool, mode: str | None, sp_size: int | None, tp_size: int
) -> SequenceSettings:
    """ColossalAI's rules: off -> no sp axis (sp_size must be None or 1); on with no mode ->
    all_to_all over sp_size ranks (1 when not given), except that megalith runs
    split_gather over tp when tp_size > 1 and no sp_size is given (the same results,
    less activation memory); "ring" runs as split_gather, "ring_attn" as all_to_all."""
    if not enable:
        if sp_size not in (None, 1):
            raise ValueError(
                f"HybridParallelPlugin: sp_size={sp_size} with enable_sequence_parallelism=False; "
                "set enable_sequence_parallelism=True (sequence_parallelism_mode='all_to_all') "
                "or leave sp_size out"
            )
        return SequenceSettings(None, 1)
    if mode is None:
        mode = "split_gather" if tp_size > 1 and sp_size in (None, 1) else "all_to_all"
    if mode == "ring":
        warn_once("sequence_parallelism_mode='ring'", "it runs as 'split_gather': same results")
        mode = "split_gather"
    elif mode == "ring_attn":
        warn_once("sequence_parallelism_mode='ring_attn'", "it runs as 'all_to_all': same results")
        mode = "all_to_all"
    if mode not in ("split_gather", "all_to_all"):
        raise NotImplementedError(
            f"HybridParallelPlugin: sequence_parallelism_mode={mode!r}; built: 'split_gather' "
            "(Megatron style, over the tp group), 'all_to_all' (Ulysses), 'ring', 'ring_attn'"
        )
    if mode == "split_gather":
        if tp_size < 2:
            raise ValueError(
                "HybridParallelPlugin: sequence_parallelism_mode='split_gather' runs over the tp "
                "group and needs tp_size > 1; use 'all_to_all' with sp_size >= 2"
            )
        return SequenceSettings("split_gather", 1)
    sp = 1 if sp_size is None else sp_size
    if not isinstance(sp, int) or sp < 1:
        raise ValueError(f"HybridParallelPlugin: sp_size must be an int >= 1, got {sp_size!r}")
    return SequenceSettings("all_to_all" if sp > 1 else None, sp)


def check_communication_dtype(dtype: Any, zero_stage: int, pp_size: int) -> torch.dtype | None:
    if dtype is None:
        return None
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise ValueError(
            f"HybridParallelPlugin: communication_dtype={dtype!r}; give a floating torch.dtype "
            "(torch.bfloat16, torch.float16, torch.float32) or None"
        )
    if zero_stage or pp_size > 1:
        raise NotImplementedError(
            f"HybridParallelPlugin: communication_dtype={dtype} is built for zero_stage=0 "
            "without a pipeline (the dp gradient average); leave it None with ZeRO or pp_size > 1 "
            "(gradients are then reduced in their own dtype)"
        )
    return dtype
