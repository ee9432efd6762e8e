"""HybridParallelPlugin(pp_size > 1): every rank holds (and its optimizer steps) only its
own stages' parameters, losses still equal the whole model's in one process, and a weight
tied across stages (GPT-2's embedding and head, on the first and the last stage) trains
under ZeRO-1 with its two copies equal (pipeline_stage_params.py)."""

from __future__ import annotations

import pytest

from tests.tensor_parallel.models import run_cases
from tests.tensor_parallel.pipeline_stage_params import StageParamsCase as Case

WORLD2 = [
    Case(),
    Case(zero_stage=1),
    Case(zero_stage=1, cpu_offload=True),  # the host step waits for the tie's sum
    Case(zero_stage=2, refused="use zero_stage=1"),
    Case(accumulate=True),  # booster.no_sync over execute_pipeline: the tie summed once
]
WORLD4 = [
    Case(tp=2, checkpoint=True),  # pp 2 x tp 2: tp shards of the stages only
    Case(zero_stage=1, checkpoint=True),  # pp 2 x dp 2, the tie summed before ZeRO's step
    Case(family="llama", tp=2, zero_stage=1),
    Case(zero_stage=1, accumulate=True),
    Case(tp=2, zero_stage=1, style="interleaved", chunks=2, microbatches=4, layers=4),
]


@pytest.mark.timeout(180)
@pytest.mark.parametrize(("world", "cases"), [(2, WORLD2), (4, WORLD4)], ids=["world2", "world4"])
def test_each_rank_holds_only_its_stages(world, cases):
    run_cases(cases, world, timeout=160)
