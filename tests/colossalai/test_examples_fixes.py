"""Regressions found by running ColossalAI's llama benchmark and its booster API and
checkpoint doc pages with the import renamed (docs/COLOSSALAI.md, "ColossalAI's
tutorials, examples and docs, renamed"): megalith.pipeline.schedule.v_schedule exists
(the benchmark imports it at the top), GeminiPlugin(placement_policy="auto") runs on
CPU ranks, and the pages' recipes give torch's numbers."""

from __future__ import annotations

import warnings

import pytest
import torch

from megalith.booster.plugin import HybridParallelPlugin
from megalith.pipeline.schedule.v_schedule import PipelineGraph, ScheduledNode
from megalith.testing import run_grid
from megalith_pipeline.schedules import make_schedule
from megalith_pipeline.simulator import PassTimes, simulate
from tests.colossalai import example_workers as w


@pytest.mark.parametrize(("pp", "micro"), [(2, 4), (4, 8)])
def test_pipeline_graph_is_megalith_pipelines_zbv_order(pp, micro):
    graph = PipelineGraph(pp, micro, 1000, 1000, 1000, 1, 10.0, 5.0, -3.0)
    nodes = graph.get_v_schedule()
    order = make_schedule("zbv", pp, micro).orders
    assert len(nodes) == pp
    for rank, (mine, theirs) in enumerate(zip(nodes, order)):
        assert all(isinstance(n, ScheduledNode) and n.stage == rank for n in mine)
        assert [(n.type, n.minibatch) for n in mine] == [
            ({"F": "F", "I": "B", "W": "W"}[a.kind], a.mb) for a in theirs
        ]
        assert [n.chunk for n in mine] == [int(a.stage >= pp) for a in theirs]
        for kind in "FBW":  # every micro-batch through both chunks of the V
            assert sum(n.type == kind for n in mine) == 2 * micro
    times = PassTimes(
        forward=1000, backward=2000, backward_input=1000, backward_weight=1000, comm=1
    )
    span = simulate(make_schedule("zbv", pp, micro), times)
    assert graph.get_v_schedule(only_run_time=True) == pytest.approx(span.makespan)
    assert graph.get_v_schedule(only_run_time=True) >= 3000 * 2 * micro  # a rank's own work


def test_pipeline_graph_refuses_bad_counts_and_the_plugin_takes_its_nodes():
    with pytest.raises(ValueError, match="n_micro=0"):
        PipelineGraph(2, 0, 1, 1, 1, 1, 1, 1, 1)
    nodes = PipelineGraph(2, 4, 1, 1, 1, 1, 1, 1, 1).get_v_schedule()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        HybridParallelPlugin(
            tp_size=1,
            pp_size=2,
            pp_style="zbv",
            num_model_chunks=2,
            microbatch_size=1,
            scheduler_nodes=nodes,
        )
    assert any("scheduler_nodes" in str(c.message) for c in caught)


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1,
    )  # fmt: skip
    path = tmp_path_factory.mktemp("llama")
    LlamaForCausalLM(config).save_pretrained(path)
    return str(path)


def test_world_2_gemini_auto_and_the_doc_pages(tmp_path, pretrained):
    settings = [
        ("gemini_auto_on_cpu", None),
        ("booster_api_page", str(tmp_path / "model")),
        ("checkpoint_page", pretrained),
    ]
    auto, api, ckpt = run_grid(w.mixed, settings, 2, timeout=120)
    for r in auto:
        assert len(r["warned"]) == 1 and "GiB per rank" in r["warned"][0], r
        assert r["loss"] < 1e-6 and r["params"] < 1e-6, r
    for r in api:
        assert r["params"] < 1e-6 and r["loaded"] == 0.0 and r["lr"] == pytest.approx(0), r
        assert r["shards"] >= 2 and r["index"], r
    for r in ckpt:
        assert r["gemini"] < 1e-3 and r["zero2"] < 1e-3, r
