"""Booster.save_optimizer / load_optimizer of pipelined models (HybridParallelPlugin with
pp_size > 1): the files are the layout-free ones of every plugin (full states by
parameter name, a weight tied across stages once), so a run saved under one tp x pp x dp
layout (ZeRO-1 or not; megalith_pipeline refuses ZeRO with a weight tied across
stages, so those cases keep GPT-2's tie on one rank with zbv) resumes under another, a non-pipelined one or plain DDP, and ends
with the weights of one uninterrupted run."""

from __future__ import annotations

import pytest

from tests.tensor_parallel.models import run_cases
from tests.tensor_parallel.pipeline_optimizer import Layout, ResumeCase

TP2, PP2, TP2PP2 = Layout(tp=2), Layout(pp=2), Layout(tp=2, pp=2)
WORLD2 = [
    ResumeCase(PP2, TP2),  # GPT-2's head tied to the embedding on the other stage
    ResumeCase(TP2, PP2, family="llama", wrong_kind=True),
]
ZBV_ZERO = Layout(tp=2, pp=2, zero_stage=1, style="zbv")  # GPT-2's tie on one rank
WORLD4 = [
    ResumeCase(TP2PP2, Layout(pp=2, zero_stage=1, style="zbv")),
    ResumeCase(Layout(ddp=True), TP2PP2),
    ResumeCase(Layout(pp=4), ZBV_ZERO, wrong_kind=True),
    ResumeCase(ZBV_ZERO, Layout(pp=4)),
    ResumeCase(
        Layout(tp=2, zero_stage=1), Layout(pp=2, style="interleaved", chunks=2), family="llama"
    ),
    # ZeRO-2 under a pipeline (pp 2 x dp 2), to and from another layout
    ResumeCase(Layout(pp=2, zero_stage=2), Layout(tp=2, zero_stage=2), family="llama"),
    ResumeCase(Layout(tp=2, zero_stage=1), Layout(pp=2, zero_stage=2, style="zbv")),
]


@pytest.mark.timeout(300)
@pytest.mark.parametrize(("world", "cases"), [(2, WORLD2), (4, WORLD4)], ids=["world2", "world4"])
def test_pipelined_optimizer_files_resume_under_another_layout(world, cases):
    run_cases(cases, world, timeout=280)
