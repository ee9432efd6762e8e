"""Issue 17: HybridParallelPlugin runs all-to-all (Ulysses) sequence parallelism beside a
pipeline, as ColossalAI does (sp_size=2, sequence_parallelism_mode="all_to_all",
pp_size=2). On 4 CPU ranks, transformers' LlamaForCausalLM and GPT2LMHeadModel (and a
classification head of each, and megalith.models' Llama; 1F1B, interleaved, ZB-V, ZeRO-1) through
booster.execute_pipeline give the plain single-process model's losses, first gradients and
parameters after three SGD-with-momentum steps (fp32, 1e-5 relative), every decoder layer
running on a sequence shard (so the pipeline's p2p carries each sp rank's shard); GPT-2's
Ulysses attention also runs beside tp 2 without a pipeline. One spawned group of 4 for all
of them; a slow test runs tp 2 x sp 2 x pp 2 and dp 2 x sp 2 x pp 2 on 8 ranks."""

from __future__ import annotations

import random

import pytest

from megalith.testing import run_grid
from tests.colossalai.sp_pp_workers import sp_pp_grid

SETTINGS = [  # (model, tp, sp, pp[, zero_stage, pp_style])
    ("LlamaForCausalLM", 1, 2, 2),
    ("LlamaForCausalLM", 1, 2, 2, 0, "zbv"),
    ("GPT2LMHeadModel", 1, 2, 2, 1, "interleaved"),
    ("GPT2LMHeadModel", 1, 2, 2),
    ("LlamaForSequenceClassification", 1, 2, 2),
    ("GPT2ForSequenceClassification", 1, 2, 2, 1),
    ("megalith.llama", 1, 2, 2),
    ("GPT2LMHeadModel", 2, 2, 1),
]

SETTINGS_8 = [("LlamaForCausalLM", 2, 2, 2), ("GPT2LMHeadModel", 1, 2, 2, 1)]


def _failures(settings: list[tuple], world: int, timeout: float) -> str:
    seed = random.randrange(2**31)  # fresh inputs every run, the same on every rank
    results = run_grid(sp_pp_grid, [(seed, *s) for s in settings], world, timeout=timeout)
    failures = [e for per_rank in results for errors in per_rank for e in errors]
    first: dict[str, str] = {}
    for e in failures:
        first.setdefault(" ".join(e.split()[:8]), e)
    return "\n".join([f"seed {seed}", *first.values()]) if failures else ""


@pytest.mark.timeout(120)
def test_all_to_all_sequence_parallelism_beside_a_pipeline_matches_the_plain_model():
    failures = _failures(SETTINGS, 4, 110)
    assert not failures, failures


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_all_to_all_beside_tp_or_dp_and_a_pipeline_on_8_ranks_matches_the_plain_model():
    failures = _failures(SETTINGS_8, 8, 190)
    assert not failures, failures


def test_a_family_without_ulysses_attention_is_refused_naming_the_fix():
    from megalith.tensor_parallel.ulysses import validate_ulysses
    from tests.colossalai.hybrid_workers import build

    with pytest.raises(ValueError, match="split_gather") as err:
        validate_ulysses(build("BertForMaskedLM"), 2)
    assert "BertForMaskedLM" in str(err.value)
    gpt2 = build("GPT2LMHeadModel")
    gpt2.config.reorder_and_upcast_attn = True
    with pytest.raises(ValueError, match="reorder_and_upcast_attn=False"):
        validate_ulysses(gpt2, 2)
    with pytest.raises(ValueError, match=r"divide the number of attention heads \(4\)"):
        validate_ulysses(build("GPT2LMHeadModel"), 8)
