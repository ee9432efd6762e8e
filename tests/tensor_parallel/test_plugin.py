"""HybridParallelPlugin (tp 2 x dp 2) trains as the unsharded model: zero_stage 0, 1 and 2,
sequence parallelism, clipping, gradient accumulation under no_sync; bad settings fail
at construction."""

from __future__ import annotations

import pytest

from megalith.booster.plugin import HybridParallelPlugin
from tests.tensor_parallel.models import run_cases
from tests.tensor_parallel.plugin import BadPluginCase, DropoutCase, PluginCase

CASES = [
    PluginCase(),
    PluginCase(sp=True, max_norm=0.05),
    PluginCase(family="gpt2", sp=True, accumulate=2),
    PluginCase(zero_stage=1),
    PluginCase(zero_stage=1, sp=True),
    PluginCase(precision="bf16", sp=True),
    PluginCase(zero_stage=1, precision="bf16"),
    PluginCase(zero_stage=2, steps=3),  # gradients reduce-scattered over dp
    PluginCase(zero_stage=2, precision="bf16", sp=True),
    BadPluginCase(),
    DropoutCase(),
    PluginCase(tp=1, sp=True, sp_size=2),  # all_to_all: dp 2 x sp 2
    PluginCase(family="gpt2", tp=1, sp=True, sp_size=2, zero_stage=1),
    PluginCase(tp=2, sp=True, sp_size=2),  # all_to_all beside tp: sp 2 x tp 2
    PluginCase(family="gpt2", tp=2, sp=True, sp_size=2, zero_stage=1, max_norm=0.05),
]


def test_hybrid_plugin_matches_unsharded():
    run_cases(CASES, 4)


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        (dict(tp_size=2, zero_stage=3), "zero_stage=3"),
        (
            dict(
                tp_size=2,
                sp_size=0,
                enable_sequence_parallelism=True,
                sequence_parallelism_mode="all_to_all",
            ),
            "sp_size",
        ),
        (dict(tp_size=0), "tp_size"),
    ],
)
def test_unsupported_settings_name_themselves(kwargs, needle):
    with pytest.raises((ValueError, NotImplementedError), match=needle):
        HybridParallelPlugin(**kwargs)


def test_ulysses_heads_must_divide_by_sp_times_tp():
    from megalith import models
    from megalith.tensor_parallel.ulysses import validate_ulysses

    model = models.create("llama-tiny", device="meta")
    heads = model.config.n_heads
    validate_ulysses(model, 2, heads // 2)  # sp x tp = heads: fits
    with pytest.raises(ValueError, match=f"sp_size 2 x tp_size {heads} = {2 * heads} does not"):
        validate_ulysses(model, 2, heads)


def test_colossalai_speed_switches_are_accepted():
    plugin = HybridParallelPlugin(
        tp_size=2, enable_flash_attention=True, enable_fused_normalization=True,
        overlap_communication=True, enable_metadata_cache=True,
    )  # fmt: skip
    assert plugin.tp_size == 2
