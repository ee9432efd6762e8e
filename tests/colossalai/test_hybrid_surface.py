"""Issue 17: HybridParallelPlugin's ColossalAI contract. Every documented argument is
accepted (speed-only ones warn once, never at their default; fp8 is refused naming what to
pass), bug 4c (pp > 1 with sequence_parallelism_mode='all_to_all' and sequence parallelism
off), ColossalAI's module paths; and on 2 CPU ranks in one process group: stage_manager,
pg_mesh, torch groups, shard_config, parallel_output True / False, the boosted optimizer
(clipping, get_grad_norm, an LR scheduler, state_dict, zero_grad) against plain torch, and
execute_pipeline's outputs of the model's own type."""

from __future__ import annotations

import warnings

import pytest
import torch

from megalith.booster.plugin.hybrid_parallel_plugin import HybridParallelPlugin
from megalith.testing import run_distributed
from tests.colossalai.hybrid_workers import surface_case

EVERY_ARGUMENT = dict(
    tp_size=1, pp_size=1, sp_size=None, precision="fp32", zero_stage=0,
    enable_all_optimization=False, enable_fused_normalization=False,
    enable_flash_attention=False, enable_jit_fused=False, enable_sequence_parallelism=False,
    sequence_parallelism_mode=None, enable_sequence_overlap=False, parallel_output=True,
    num_microbatches=None, microbatch_size=None, initial_scale=2**16, min_scale=1,
    growth_factor=2, backoff_factor=0.5, growth_interval=1000, hysteresis=2, max_scale=2**32,
    max_norm=0, broadcast_buffers=True, ddp_bucket_cap_mb=25, find_unused_parameters=False,
    check_reduction=False, gradient_as_bucket_view=False, static_graph=False,
    zero_bucket_size_in_m=12, cpu_offload=False, communication_dtype=None,
    overlap_communication=True, custom_policy=None, pp_style="1f1b", num_model_chunks=1,
    scheduler_nodes=None, num_layers_per_stage=None, gradient_checkpoint_config=None,
    enable_metadata_cache=True, make_vocab_size_divisible_by=64, dp_outside=True,
    overlap_p2p=True, overlap_allgather=False, fp8_communication=False, use_fp8=False,
    inner_ring_size=None,
)  # fmt: skip


def test_every_colossalai_argument_at_its_default_is_silent():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        plugin = HybridParallelPlugin(**EVERY_ARGUMENT)
    assert plugin.parallel_output and plugin.stage_manager is None


def test_speed_only_arguments_warn_once_naming_themselves():
    with pytest.warns(UserWarning, match="static_graph is ignored"):
        HybridParallelPlugin(tp_size=1, static_graph=True, enable_flash_attention=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        HybridParallelPlugin(tp_size=1, static_graph=True, enable_flash_attention=True)


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        (dict(fp8_communication=True), "fp8_communication=False"),
        (dict(use_fp8=True), "precision='bf16'"),
        (dict(zero_stage=1, communication_dtype=torch.bfloat16), "leave it None"),
        (dict(sp_size=2), "enable_sequence_parallelism=True"),
        (dict(enable_sequence_parallelism=True, sequence_parallelism_mode="x"), "built:"),
    ],
)
def test_result_changing_arguments_are_refused_naming_the_fix(kwargs, needle):
    with pytest.raises((ValueError, NotImplementedError), match=needle):
        HybridParallelPlugin(tp_size=1, **kwargs)


def test_bug_4c_pp_with_all_to_all_mode_and_sequence_parallelism_off():
    plugin = HybridParallelPlugin(
        tp_size=1, pp_size=2, num_microbatches=2, sequence_parallelism_mode="all_to_all"
    )
    assert plugin.sp_mode is None and plugin.sp_size == 1
    plugin = HybridParallelPlugin(  # sp on beside a pipeline: test_hybrid_sp_pp.py runs it
        tp_size=1, pp_size=2, num_microbatches=2, sp_size=2,
        enable_sequence_parallelism=True, sequence_parallelism_mode="all_to_all",
    )  # fmt: skip
    assert (plugin.sp_mode, plugin.sp_size, plugin.pp_size) == ("all_to_all", 2, 2)


def test_colossalai_module_paths():
    from megalith.booster.plugin.moe_hybrid_parallel_plugin import MoeHybridParallelPlugin
    from megalith.booster.plugin.pp_plugin_base import PipelinePluginBase

    assert isinstance(HybridParallelPlugin(tp_size=1), PipelinePluginBase)
    assert MoeHybridParallelPlugin(tp_size=1, pp_size=1, ep_size=1).ep_size == 1
    assert MoeHybridParallelPlugin(tp_size=1, pp_size=1, ep_size=2).ep_size == 2
    with pytest.raises(ValueError, match="pass precision='bf16'"):
        MoeHybridParallelPlugin(tp_size=1, pp_size=1, ep_size=2, zero_stage=1, precision="fp16")
    with pytest.raises(ValueError, match="pass tp_size=1"):
        MoeHybridParallelPlugin(tp_size=2, pp_size=1, ep_size=2)


@pytest.mark.timeout(120)
def test_plugin_surface_on_two_ranks():
    errors = run_distributed(surface_case, 2, timeout=100)
    failures = [e for per_rank in errors for e in per_rank]
    assert not failures, "\n".join(failures[:20])
