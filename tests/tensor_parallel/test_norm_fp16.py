"""HybridParallelPlugin: clipping (max_norm) and fp16 loss scaling over the whole model
when ZeRO or plain data parallelism is combined with tp and pp. The norm equals torch's
clip_grad_norm_ on the unsharded model (1e-5); an fp16 overflow on one rank skips the
step on every rank; fp16 training stays near fp32 (see tests/tp/norm_fp16.py)."""

from __future__ import annotations

import pytest

from tests.tensor_parallel.models import run_cases
from tests.tensor_parallel.norm_fp16 import ClipCase, Fp16Case, Fp16SkipCase

WORLD2 = [
    ClipCase(zero_stage=0),  # tp 2: the zero_stage 0 norm, for comparison
    ClipCase(zero_stage=1),
    ClipCase(zero_stage=2),
    ClipCase(tp=1, pp=2, family="gpt2", style="zbv"),  # pp 2, GPT-2's tie on one rank
    Fp16SkipCase(zero_stage=0, resume=True),
    Fp16SkipCase(zero_stage=1),
    Fp16Case(zero_stage=0),
    Fp16Case(zero_stage=1),
    Fp16Case(zero_stage=1, max_norm=0.05),
    Fp16Case(
        tp=1, pp=2, max_norm=0.05
    ),  # autocast fp16 under a pipeline, the loss scaled per micro-batch
    Fp16SkipCase(tp=1, pp=2, zero_stage=1, resume=True),  # the overflow on stage 2 only
]
WORLD4 = [
    ClipCase(zero_stage=1),  # dp 2 x tp 2
    ClipCase(zero_stage=2, family="gpt2"),
    ClipCase(tp=2, pp=2, family="llama"),  # tp 2 x pp 2, ZeRO-1 over a dp of 1
    ClipCase(tp=1, pp=2, family="gpt2", style="zbv"),  # pp 2 x dp 2, tie on one rank
    ClipCase(tp=1, pp=2, zero_stage=0, family="gpt2"),  # the tie across stages
    Fp16SkipCase(zero_stage=0),
    Fp16SkipCase(zero_stage=1),
    Fp16SkipCase(zero_stage=2),
    Fp16Case(zero_stage=2, max_norm=0.05),
    Fp16Case(tp=2, pp=2, zero_stage=1, max_norm=0.05),
    Fp16SkipCase(tp=2, pp=2, zero_stage=0, resume=True),
    Fp16SkipCase(tp=2, pp=2, zero_stage=1),
]


@pytest.mark.timeout(300)
@pytest.mark.parametrize(("world", "cases"), [(2, WORLD2), (4, WORLD4)], ids=["world2", "world4"])
def test_norm_and_fp16_span_tp_pp_and_zero(world, cases):
    run_cases(cases, world, timeout=280)
