"""The data-parallel plugins: ColossalAI's arguments (honoured, warned about once when
only performance-tuning, or refused with the fix), ZeRO's buffers in half precision
(bug: BatchNorm failed with "expected scalar type Half but found Float"), gradient
accumulation, TorchFSDPPlugin's checkpoints, and prepare_dataloader."""

from __future__ import annotations

import inspect
import warnings

import pytest

from megalith.booster.plugin import (
    DPPluginBase,
    GeminiPlugin,
    LowLevelZeroPlugin,
    TorchDDPPlugin,
    TorchFSDPPlugin,
)
from megalith.testing import run_grid
from tests.colossalai import dp_workers as w

#: ColossalAI's arguments (commit 4f9953be), each accepted by name
COLOSSALAI_ARGS = {
    TorchDDPPlugin: "broadcast_buffers bucket_cap_mb find_unused_parameters check_reduction "
    "gradient_as_bucket_view static_graph fp8_communication",
    LowLevelZeroPlugin: "stage precision initial_scale min_scale growth_factor backoff_factor "
    "growth_interval hysteresis max_scale max_norm norm_type reduce_bucket_size_in_m "
    "communication_dtype overlap_communication overlap_allgather cpu_offload master_weights "
    "verbose cast_inputs fp8_communication use_fp8 extra_dp_size",
    GeminiPlugin: "chunk_config_dict chunk_init_device placement_policy "
    "enable_gradient_accumulation max_prefetch shard_param_frac offload_optim_frac "
    "offload_param_frac warmup_non_model_data_ratio steady_cuda_cap_ratio precision "
    "master_weights pin_memory force_outputs_fp32 strict_ddp_mode search_range_m hidden_dim "
    "min_chunk_size_m memstats gpu_margin_mem_ratio initial_scale min_scale growth_factor "
    "backoff_factor growth_interval hysteresis max_scale max_norm norm_type tp_size "
    "extra_dp_size enable_all_optimization enable_fused_normalization enable_flash_attention "
    "enable_sequence_parallelism enable_jit_fused enable_async_reduce use_fp8 verbose "
    "fp8_communication",
    TorchFSDPPlugin: "process_group sharding_strategy cpu_offload auto_wrap_policy "
    "backward_prefetch mixed_precision ignored_modules param_init_fn sync_module_states "
    "fp8_communication",
}


@pytest.mark.parametrize("cls", list(COLOSSALAI_ARGS))
def test_colossalai_arguments_accepted_and_defaults_silent(cls):
    params = inspect.signature(cls).parameters
    missing = [a for a in COLOSSALAI_ARGS[cls].split() if a not in params]
    assert not missing, f"{cls.__name__} lacks {missing}"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        plugin = cls()
    assert isinstance(plugin, DPPluginBase)


@pytest.mark.parametrize(
    ("make", "name"),
    [
        (lambda: GeminiPlugin(search_range_m=64), "search_range_m"),
        (lambda: GeminiPlugin(shard_param_frac=0.5), "shard_param_frac"),
        (lambda: GeminiPlugin(enable_flash_attention=True), "enable_flash_attention"),
        (lambda: GeminiPlugin(extra_dp_size=2), "extra_dp_size"),
        (lambda: GeminiPlugin(max_prefetch=2), "max_prefetch"),
        (lambda: LowLevelZeroPlugin(use_fp8=True), "use_fp8"),
        (lambda: LowLevelZeroPlugin(extra_dp_size=2), "extra_dp_size"),
        (lambda: TorchDDPPlugin(fp8_communication=True), "fp8_communication"),
        (lambda: TorchFSDPPlugin(backward_prefetch="BACKWARD_PRE"), "backward_prefetch"),
    ],
)
def test_performance_only_arguments_warn_once(make, name):
    from megalith.booster.plugin import base

    base._WARNED.clear()
    with pytest.warns(UserWarning, match=f"{name}=.* is ignored"):
        make()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        make()  # once


@pytest.mark.parametrize(
    ("make", "fix"),
    [
        (lambda: LowLevelZeroPlugin(norm_type=1.0), "norm_type=2.0"),
        (lambda: LowLevelZeroPlugin(master_weights=False), "master_weights=True"),
        (lambda: LowLevelZeroPlugin(cast_inputs=False), "cast_inputs=True"),
        (lambda: GeminiPlugin(master_weights=False, precision="bf16"), "master_weights=True"),
        (lambda: GeminiPlugin(chunk_config_dict={2: 5}), "chunk_size"),
    ],
)
def test_result_changing_arguments_refused_with_the_fix(make, fix):
    with pytest.raises((ValueError, NotImplementedError), match=fix.replace("(", r"\(")):
        make()


def test_fsdp_refuses_low_precision_grads():
    from torch.distributed.fsdp import MixedPrecision

    with pytest.raises(ValueError, match="keep_low_precision_grads=False"):
        TorchFSDPPlugin(mixed_precision=MixedPrecision(keep_low_precision_grads=True))


SETTINGS = [
    ("zero1", "fp16"),
    ("zero2", "bf16"),
    ("gemini", "bf16"),
    ("gemini", "fp16"),
    ("ddp", "bf16"),
]


def _check_batch_norm(results: list) -> None:
    for (name, precision), per_rank in zip(SETTINGS, results):
        for r in per_rank:
            assert r["rel"] < 5e-2, (name, precision, r)
            half = "float16" if precision == "fp16" else "bfloat16"
            want = "torch.float32" if name == "ddp" else f"torch.{half}"
            assert r["running_mean"] == want, (name, precision, r)


def test_world_2_batch_norm_in_half_precision_and_accumulation(tmp_path):
    acc = ["gemini", "zero2", "ddp"]
    alone = ["gemini", "zero2"]
    settings = [("batch_norm_half", s) for s in SETTINGS] + [("accumulation", a) for a in acc]
    settings += [("model_alone", (a, str(tmp_path / a))) for a in alone]
    results = run_grid(w.mixed, settings, 2, timeout=90)
    _check_batch_norm(results[: len(SETTINGS)])
    n = len(SETTINGS) + len(acc)
    for name, per_rank in zip(acc, results[len(SETTINGS) : n]):
        assert max(per_rank) < 1e-6, (name, per_rank)
    for name, per_rank in zip(alone, results[n:]):  # boost(model) with no optimizer
        for r in per_rank:
            assert r["opt"] and r["forward"] < 1e-6 and r["saved"] == 0.0, (name, r)


def test_world_3_batch_norm_fsdp_checkpoint_and_dataloader(tmp_path):
    settings = [("batch_norm_half", s) for s in SETTINGS]
    settings += [("released_params", 0)]
    settings += [("fsdp_checkpoint", str(tmp_path)), ("dataloader_order", 0)]
    results = run_grid(w.mixed, settings, 3, timeout=90)
    _check_batch_norm(results[: len(SETTINGS)])
    for r in results[-3]:  # Gemini's released parameters, read between steps
        assert r["shapes"] and r["nan"], r
        assert r["forward"] < 1e-6 and r["again"] == 0 and r["state"] < 1e-6, r
    for r in results[-2]:
        assert r["loaded"] < 1e-7 and r["states"] < 1e-7 and r["next"] < 1e-6, r
    for rank, r in enumerate(results[-1]):
        assert r == {"same": True, "rank": rank, "size": 3}, r
