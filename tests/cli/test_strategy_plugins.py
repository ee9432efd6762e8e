"""The Booster's plugins are made from a Strategy: ColossalAI's constructor arguments
become one, Strategy.make_plugin gives the same plugin back, and megalith_zero's
ZeroConfig comes from Strategy.zero_config alone. Nothing here starts a process group."""

from __future__ import annotations

import pytest
import torch

from megalith.booster import (
    Booster,
    GeminiPlugin,
    HybridParallelPlugin,
    LowLevelZeroPlugin,
    TorchDDPPlugin,
)
from megalith.strategy import Parallel, Strategy, ZeroTuning, colossal_loss_scale
from megalith_offload import OffloadConfig
from megalith_zero import ZeroConfig

CASES = [
    (TorchDDPPlugin(max_norm=1.0), Strategy(plugin="ddp", max_norm=1.0)),
    (LowLevelZeroPlugin(stage=1, precision="bf16"), Strategy(plugin="zero1", precision="bf16")),
    (
        LowLevelZeroPlugin(stage=2, cpu_offload=True, max_norm=1.0, initial_scale=2**16),
        Strategy(
            plugin="zero2",
            precision="fp16",
            offload=OffloadConfig(tier="host"),
            max_norm=1.0,
            loss_scale=colossal_loss_scale(initial_scale=2**16),
        ),
    ),
    (
        LowLevelZeroPlugin(
            stage=2,
            precision="bf16",
            reduce_bucket_size_in_m=4,
            communication_dtype=torch.float32,
            overlap_allgather=True,
        ),
        Strategy(
            plugin="zero2",
            precision="bf16",
            zero=ZeroTuning(
                chunk_bytes=4 << 20, reduce_dtype=torch.float32, overlap_param_gather=True
            ),
        ),
    ),
    (
        GeminiPlugin(precision="bf16", offload_optim_frac=0.5, offload_param_frac=0.25),
        Strategy(
            plugin="gemini",
            precision="bf16",
            offload=OffloadConfig(optim_frac=0.5, param_frac=0.25),
        ),
    ),
    (
        GeminiPlugin(placement_policy="auto", steady_cuda_cap_ratio=0.75),
        Strategy(
            plugin="gemini",
            precision="fp16",
            offload=OffloadConfig(placement="auto", headroom=0.25),
        ),
    ),
    (
        HybridParallelPlugin(tp_size=2, zero_stage=1, precision="bf16", cpu_offload=True),
        Strategy(
            plugin="hybrid",
            zero_stage=1,
            precision="bf16",
            parallel=Parallel(tp=2),
            offload=OffloadConfig(tier="host"),
        ),
    ),
    (
        HybridParallelPlugin(
            tp_size=1,
            pp_size=2,
            num_microbatches=4,
            pp_style="interleaved",
            num_model_chunks=2,
            zero_stage=2,
            precision="fp16",
            max_norm=1.0,
        ),
        Strategy(
            plugin="hybrid",
            zero_stage=2,
            precision="fp16",
            max_norm=1.0,
            parallel=Parallel(pp=2, num_microbatches=4, pp_style="interleaved", num_model_chunks=2),
        ),
    ),
    (
        HybridParallelPlugin(
            tp_size=2,
            enable_sequence_parallelism=True,
            sequence_parallelism_mode="all_to_all",
            sp_size=2,
        ),
        Strategy(plugin="hybrid", parallel=Parallel(tp=2, sp=2, sequence_parallelism="all_to_all")),
    ),
]


@pytest.mark.parametrize(("from_kwargs", "strategy"), CASES)
def test_plugin_from_kwargs_equals_plugin_from_strategy(from_kwargs, strategy):
    assert from_kwargs.strategy == strategy
    made = strategy.make_plugin()
    assert type(made) is type(from_kwargs) and made.strategy == from_kwargs.strategy
    assert (made.precision, made.max_norm) == (strategy.precision, strategy.max_norm)
    if strategy.zero_stage:  # the ZeRO plugins' own zero_config is the Strategy's
        zero_config = getattr(from_kwargs, "zero_config", from_kwargs.strategy.zero_config)
        assert made.strategy.zero_config() == zero_config()


def test_hybrid_reads_its_sizes_from_the_strategy():
    plugin = Strategy(
        plugin="hybrid", zero_stage=1, parallel=Parallel(tp=2, pp=2, microbatch_size=1)
    ).make_plugin()
    assert (plugin.tp_size, plugin.pp_size, plugin.sp_size, plugin.zero_stage) == (2, 2, 1, 1)
    assert plugin.pipeline.microbatch_size == 1 and plugin.custom_policy is None


def test_zero_config_is_the_strategy_s():
    s = Strategy(plugin="zero2", precision="bf16", offload=OffloadConfig(), max_norm=0.0)
    assert s.zero_config() == ZeroConfig(
        stage=2,
        precision="bf16",
        chunk_bytes=12 << 20,
        loss_scale=s.loss_scale,
        offload=OffloadConfig(),
        step_in_backward=True,  # offloaded, neither clipping nor scaling
        shard_each_param=True,  # LowLevelZero's per-parameter slices
    )
    # under a pipeline bf16 and fp16 are autocast over fp32 parameters; fp16 still scales
    piped = Strategy(
        plugin="hybrid", zero_stage=1, precision="fp16",
        parallel=Parallel(pp=2, num_microbatches=2),
    ).zero_config()  # fmt: skip
    assert (piped.precision, piped.loss_scaling, piped.stage) == ("fp32", True, 1)
    with pytest.raises(ValueError, match="shards nothing"):
        Strategy(plugin="ddp").zero_config()


def test_setters_go_through_the_strategy():
    plugin = LowLevelZeroPlugin(stage=2, precision="fp32")
    plugin.set_precision("bf16")
    plugin.set_offload(tier="nvme", master_tier="nvme")
    assert plugin.strategy == Strategy(
        plugin="zero2", precision="bf16", offload=OffloadConfig(tier="nvme", master_tier="nvme")
    )
    with pytest.raises(ValueError, match="use plugin='gemini', or param_frac=0"):
        plugin.set_offload(param_frac=0.5)
    with pytest.raises(ValueError, match=r"build the plugin with strategy\.make_plugin"):
        plugin.strategy = Strategy(plugin="gemini")
    assert Booster(plugin="zero2", mixed_precision="bf16").plugin.strategy == Strategy(
        plugin="zero2", precision="bf16"
    )


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_a_booster_keeps_the_precision_of_a_strategy_s_ddp_plugin(precision):
    """`megalith train --plugin ddp` on a GPU built Booster(plugin=strategy.make_plugin())
    and trained in fp32 (the DDP plugin took the Booster's mixed_precision=None): 5% MFU."""
    plugin = Strategy(plugin="ddp", precision=precision).make_plugin()
    assert Booster(plugin=plugin).plugin.precision == precision
    again = Strategy(plugin="ddp", precision=precision).make_plugin()
    assert Booster(plugin=again, mixed_precision="fp32").plugin.precision == "fp32"
    assert Booster(plugin=TorchDDPPlugin()).plugin.precision == "fp32"  # ColossalAI's rule
    assert Booster(plugin=TorchDDPPlugin(), mixed_precision=precision).plugin.precision == precision
