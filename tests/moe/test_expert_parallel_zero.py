"""MoeHybridParallelPlugin(ep_size > 1, zero_stage=1) on CPU ranks: ZeRO over the dense
weights, the experts stepped beside it by an optimizer of the user's class. transformers'
tiny Mixtral, each rank building its own weights, trains as the plain model on the whole
batch in one process (losses and trained weights within 1e-5 in fp32), clipped by the whole
model's norm every step, a StepLR built before boost halving the lr of both parts each
step, saved and reloaded into a fresh boosted model (optimizer too) that goes on equal.
World 2 (ep 2, and bf16 as ColossalAI's Mixtral example) and world 4 (ep 2 x moe_dp 2).
Under Adam (torch's AdamW in fp32, HybridAdam in bf16 with the experts' fp32 masters in
the files) a reloaded run goes on bit-equal to the saved one."""

from __future__ import annotations

import warnings

import pytest

from megalith.testing import run_grid

pytest.importorskip("transformers")

from tests.moe import moe_workers as w
from tests.moe.test_expert_parallel import _assert_clean


@pytest.mark.timeout(150)
def test_zero_1_beside_experts_on_2_ranks():
    cases = [
        w.Case(zero_stage=1, max_norm=0.05, checkpoint=True, scheduler=True),
        w.Case(zero_stage=1, precision="bf16", steps=2),
    ]
    _assert_clean(cases, run_grid(w.run, cases, 2, timeout=140))


@pytest.mark.timeout(150)
def test_zero_1_beside_experts_on_4_ranks():
    cases = [w.Case(ep=2, zero_stage=1, max_norm=0.05, checkpoint=True, scheduler=True)]
    _assert_clean(cases, run_grid(w.run, cases, 4, timeout=140))


@pytest.mark.timeout(150)
def test_zero_1_beside_experts_resumes_bit_equal_under_adam():
    cases = [w.Resume(), w.Resume(precision="bf16", optimizer="hybrid")]
    _assert_clean(cases, run_grid(w.resume_equal, cases, 2, timeout=140))


def test_zero_stage_2_runs_as_1_with_one_warning_and_fp16_is_refused():
    from megalith.booster.plugin import moe_hybrid_parallel_plugin as moe

    moe._warned_stage_2 = False
    with pytest.warns(UserWarning, match="zero_stage=2 runs as zero_stage=1"):
        plugin = moe.MoeHybridParallelPlugin(tp_size=1, pp_size=1, ep_size=2, zero_stage=2)
    assert plugin.zero_stage == 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        moe.MoeHybridParallelPlugin(tp_size=1, pp_size=1, ep_size=1, zero_stage=2)
    with pytest.raises(ValueError, match="pass precision='bf16'"):
        moe.MoeHybridParallelPlugin(tp_size=1, pp_size=1, ep_size=2, zero_stage=1, precision="fp16")
