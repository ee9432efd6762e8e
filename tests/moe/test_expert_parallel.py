"""Expert parallelism (MoeHybridParallelPlugin, ep_size > 1) on CPU ranks: transformers'
tiny Mixtral and Qwen3-MoE, each rank building its own weights, train as the plain model
on the whole batch in one process: losses of three SGD-momentum steps and the first
step's gradients of every weight (experts gathered over ep) within 1e-5, gradient
clipping by the whole model's norm; saved files that transformers' from_pretrained reads
as the trained model and that a fresh boosted model reloads (optimizer too) and goes on
from. World 2 (ep 2), 3 (ep 3, 6 experts: 2 a rank) and 4 (ep 2 x moe_dp 2; ep 4)."""

from __future__ import annotations

import pytest

from megalith.testing import run_grid

pytest.importorskip("transformers")

from tests.moe import moe_workers as w


def _assert_clean(cases, results) -> None:
    failures = [f"{case}: rank {r}: {e}" for case, per_rank in zip(cases, results)
                for r, errors in enumerate(per_rank) for e in errors]  # fmt: skip
    assert not failures, "\n".join(failures[:20])


@pytest.mark.timeout(150)
def test_expert_parallel_on_2_ranks():
    cases = [
        w.Case(),
        w.Case(family="qwen3_moe", max_norm=0.05),
        w.Case(steps=3, checkpoint=True),
        w.Case(precision="bf16", steps=2),  # ColossalAI's Mixtral example trains in bf16
    ]
    _assert_clean(cases, run_grid(w.run, cases, 2, timeout=140))


@pytest.mark.timeout(150)
def test_expert_parallel_on_3_and_4_ranks():
    three = [w.Case(ep=3, experts=6, checkpoint=True)]
    _assert_clean(three, run_grid(w.run, three, 3, timeout=140))
    four = [w.Case(ep=2), w.Case(ep=4, family="qwen3_moe", max_norm=0.05)]
    _assert_clean(four, run_grid(w.run, four, 4, timeout=140))


def test_models_expert_parallelism_cannot_split_are_refused_before_any_collective():
    import torch

    from megalith.moe import validate_experts

    with pytest.raises(ValueError, match="has no mixture-of-experts layer"):
        validate_experts(torch.nn.Linear(4, 4), 2)
    with pytest.raises(ValueError, match="4 experts, which do not divide over 3 ranks"):
        validate_experts(w.tiny("mixtral", 4, 0), 3)
    assert validate_experts(w.tiny("qwen3_moe", 4, 0), 4) == 2
