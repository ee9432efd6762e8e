"""HybridParallelPlugin with pp_size > 1 (Booster.execute_pipeline) trains transformers'
GPT-2 and Llama as the whole model in one process does: pp 2 under 1F1B, interleaved and
ZB-V, tp 2 x pp 2 with and without sequence parallelism, pp 2 x dp 2 with ZeRO-1 and ZeRO-2, clipping across stages, bf16; model files saved under tp 2 x pp 2 hold the whole model
and load under pp 2 x dp 2; bad pipeline
settings fail at construction."""

from __future__ import annotations

import pytest

from megalith.booster.plugin import HybridParallelPlugin
from tests.tensor_parallel.models import run_cases
from tests.tensor_parallel.pipeline_plugin import PipePluginCase

WORLD2 = [
    PipePluginCase(outputs=True),
    PipePluginCase(family="llama", style="interleaved", chunks=2, microbatches=4),
    PipePluginCase(style="zbv", microbatches=4, outputs=True),
]
WORLD4 = [
    PipePluginCase(family="llama", tp=2, checkpoint=True),
    PipePluginCase(family="llama", tp=2, sp=True, style="interleaved", chunks=2, outputs=True),
    PipePluginCase(tp=2, sp=True),
    PipePluginCase(tp=2, style="zbv", checkpoint=True),  # tied head and embedding on pp rank 0
    PipePluginCase(family="llama", tp=2, style="zbv", max_norm=0.05),
    PipePluginCase(family="llama", zero_stage=1, style="interleaved", chunks=2),
    PipePluginCase(family="llama", tp=2, precision="bf16"),
    PipePluginCase(family="llama", zero_stage=1, precision="bf16"),
    # ZeRO-2 under a pipeline: one reduce-scatter per step, after the last micro-batch
    PipePluginCase(family="llama", zero_stage=2, microbatches=4),
    PipePluginCase(family="llama", zero_stage=2, style="interleaved", chunks=2, max_norm=0.05),
    PipePluginCase(style="zbv", zero_stage=2, microbatches=4, checkpoint=True),
    PipePluginCase(family="llama", tp=2, zero_stage=2, style="zbv", microbatches=4),
]


@pytest.mark.timeout(240)
@pytest.mark.parametrize(("world", "cases"), [(2, WORLD2), (4, WORLD4)], ids=["world2", "world4"])
def test_pipelined_plugin_matches_the_whole_model(world, cases):
    run_cases(cases, world, timeout=220)


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        (dict(tp_size=1, pp_size=2), "exactly one of num_microbatches and microbatch_size"),
        (dict(tp_size=1, pp_size=2, num_microbatches=2, pp_style="zb-h2"), "pp_style='zb-h2'"),
        (
            dict(tp_size=1, pp_size=2, num_microbatches=2, pp_style="interleaved"),
            "num_model_chunks >= 2",
        ),
        (dict(tp_size=1, pp_size=2, num_microbatches=2, num_model_chunks=3), "one model chunk"),
        (dict(tp_size=1, pp_size=0), "pp_size"),
    ],
)
def test_bad_pipeline_settings_name_themselves(kwargs, needle):
    with pytest.raises(ValueError, match=needle):
        HybridParallelPlugin(**kwargs)
