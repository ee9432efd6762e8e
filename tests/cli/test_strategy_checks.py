"""A Strategy checks itself when made: a combination that cannot run fails at once, before
any collective, and the message names the fix."""

from __future__ import annotations

import dataclasses

import pytest

from megalith.strategy import Parallel, Strategy, ZeroTuning
from megalith_core.loss_scale import LossScaleConfig
from megalith_offload import OffloadConfig


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: Strategy(plugin="zero3"), "ZeRO stage 3 is 'gemini'"),
        (lambda: Strategy(precision="fp8"), "expected one of fp32, fp16, bf16"),
        (lambda: Strategy(plugin="zero1", zero_stage=2), "use plugin='zero2'"),
        (lambda: Strategy(plugin="hybrid", zero_stage=3), "plugin='gemini' runs stage 3"),
        (lambda: Strategy(parallel=Parallel(tp=2)), "run in plugin='hybrid'"),
        (lambda: Strategy(offload=OffloadConfig()), "use plugin='zero2'"),
        (
            lambda: Strategy(plugin="hybrid", parallel=Parallel(tp=2), offload=OffloadConfig()),
            "use zero_stage=1 or 2",
        ),
        (
            lambda: Strategy(plugin="zero2", offload=OffloadConfig(param_frac=0.5)),
            "use plugin='gemini', or param_frac=0",
        ),
        (
            lambda: Strategy(plugin="hybrid", zero_stage=1, offload=OffloadConfig(tier="nvme")),
            "use OffloadConfig(tier='host')",
        ),
        (lambda: Strategy(max_norm=-1.0), "expected >= 0 (0: no clipping)"),
        (lambda: Strategy(max_norm=float("inf")), "expected a finite norm"),
        (
            lambda: Strategy(loss_scale=LossScaleConfig(initial=8.0)),
            "leave loss_scale out, or use a ZeRO or hybrid plugin",
        ),
        (lambda: Strategy(zero=ZeroTuning(chunk_bytes=1 << 20)), "use a ZeRO plugin"),
        (
            lambda: Strategy(plugin="gemini", zero=ZeroTuning(overlap_param_gather=True)),
            "use it with zero1 or zero2",
        ),
        (lambda: Strategy(step_in_backward=True), "use a ZeRO plugin"),
        (lambda: ZeroTuning(chunk_bytes=-1), "expected None (the plugin's default) or an int"),
        (lambda: Parallel(tp=0), "tp=0; expected an int >= 1"),
        (lambda: Parallel(sp=2), "sequence_parallelism='all_to_all'"),
        (
            lambda: Parallel(sequence_parallelism="all_to_all"),
            "give the sequence axis's size, sp >= 2",
        ),
        (lambda: Parallel(pp=2), "give exactly one of num_microbatches and microbatch_size"),
        (lambda: Parallel(pp=2, num_microbatches=4, pp_style="zz"), "pp_style='zz'"),
    ],
)
def test_bad_strategy_names_the_fix(make, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        make()


def test_defaults_are_each_plugins_own():
    """Left out, the loss scale and chunk size are what the plugin would take; given, they
    compare equal to the defaults spelled out."""
    assert Strategy().loss_scale == LossScaleConfig()  # torch's GradScaler
    zero2 = Strategy(plugin="zero2")
    assert zero2.zero_stage == 2 and zero2.loss_scale.initial == 2.0**32
    assert zero2.zero.chunk_bytes == 12 << 20
    assert zero2 == Strategy(plugin="zero2", zero_stage=2, loss_scale=zero2.loss_scale)
    gemini = Strategy(plugin="gemini")
    assert (gemini.zero_stage, gemini.loss_scale.initial, gemini.zero.chunk_bytes) == (3, 2**16, 0)
    assert Strategy(plugin="hybrid", parallel=Parallel(tp=2)).zero_stage == 0


def test_frozen_and_replace_checks_again():
    s = Strategy(plugin="zero2")
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.precision = "bf16"  # type: ignore[misc]
    assert s.replace(precision="bf16").precision == "bf16"
    with pytest.raises(ValueError, match="expected one of"):
        s.replace(precision="fp8")
    # another plugin brings its own stage and defaults; what was set stays
    assert s.replace(plugin="gemini") == Strategy(plugin="gemini")
    clipped = Strategy(plugin="zero1", max_norm=1.0, zero=ZeroTuning(chunk_bytes=1 << 20))
    assert clipped.replace(plugin="gemini") == Strategy(
        plugin="gemini", max_norm=1.0, zero=ZeroTuning(chunk_bytes=1 << 20)
    )


def test_clipping_and_scaling_keep_offloaded_updates_in_step():
    offload = OffloadConfig()
    assert Strategy(plugin="zero2", offload=offload).updates_in_backward
    assert not Strategy(plugin="zero2", offload=offload, max_norm=1.0).updates_in_backward
    assert not Strategy(plugin="zero2", offload=offload, precision="fp16").updates_in_backward
    assert not Strategy(plugin="zero2").updates_in_backward


def test_data_parallel_size_is_what_the_model_parallel_axes_leave():
    s = Strategy(plugin="hybrid", parallel=Parallel(tp=2, pp=2, num_microbatches=2))
    assert s.dp_size(8) == 2 and Strategy(plugin="zero2").dp_size(3) == 3
    with pytest.raises(ValueError, match="run a multiple of 4 ranks"):
        s.dp_size(6)
