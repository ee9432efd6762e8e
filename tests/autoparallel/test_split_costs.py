"""The split backward's own costs in the cost model (split_costs.py) against what
megalith_pipeline's split really does: one W call per frontier node counted from the
traced ops, a checkpointed block recomputed once in W, ZeRO reducing once per
call of the last W pass; and calibrate's micro-benchmark of the per-call cost."""

from __future__ import annotations

import json
import random

import pytest
import torch

from megalith import models
from megalith.autoparallel import analyze, predict
from megalith.autoparallel.calibrate_split import split_backward_call_s
from megalith.autoparallel.split_costs import frontier_nodes
from megalith.autoparallel.stages import last_weight_stage, virtual_stages
from megalith.autoparallel.types import Cluster, MachineProfile
from megalith_pipeline.backward_split import input_pass

from .handmade import cpu_like

CFG = dict(d_model=64, n_layers=4, n_heads=4, d_ff=256, vocab_size=256, max_seq_len=64)
SEQ = 32


def _model(seed: int):
    model = models.create("gpt-tiny", device="meta", **CFG)
    models.materialize(model, device=torch.device("cpu"), seed=seed)
    return model


def _split(model, layers: list[int]):
    """input_pass over blocks `layers` of model: (its WeightPass, the input's leaf)."""
    x = torch.randn(2, SEQ, CFG["d_model"], requires_grad=True)
    y = x
    for i in layers:
        y = model.blocks[i](y)
    weights = [p for i in layers for p in model.blocks[i].parameters()]
    _, weight_pass = input_pass([y], [torch.randn_like(y)], [x], weights)
    return weight_pass


def test_frontier_nodes_are_the_w_calls_megalith_pipeline_makes():
    model = _model(random.randrange(1000))
    a = analyze(models.create("gpt-tiny", device="meta", **CFG), SEQ, precision="fp32")
    weight_pass = _split(model, [1, 2])
    want = frontier_nodes(a.blocks[1]) + frontier_nodes(a.blocks[2])
    assert want == 12  # ln_1, c_attn, attn c_proj, ln_2, c_fc, mlp c_proj per block
    assert len(weight_pass._calls) == want
    assert frontier_nodes(a.pre) == 0  # embeddings are weights-only


def test_w_recomputes_a_checkpointed_block_once():
    model = _model(random.randrange(1000))
    model.set_activation_checkpointing(True, [1])
    runs = []
    hook = model.blocks[1].ln_1.register_forward_hook(lambda *_: runs.append(1))
    try:
        weight_pass = _split(model, [1])
        after_i = len(runs)
        weight_pass.run()
    finally:
        hook.remove()
    assert after_i == 2  # the forward and I's recompute
    assert len(runs) - after_i == 1  # W's calls share one recompute (split_costs.py)


def test_the_model_charges_w_its_calls_and_recomputes():
    a = analyze(models.create("gpt-tiny", device="meta", **CFG), SEQ, precision="fp32")
    prof = cpu_like()
    cluster = Cluster(profile=MachineProfile(**{**prof.__dict__, "split_backward_call_s": 1e-4}))
    kw = dict(dp=2, pp=2, num_microbatches=4, precision="fp32", schedule="zbv")
    plain, ckpt = predict(a, cluster, **kw), predict(a, cluster, **kw, ckpt=1.0)
    one_f1b = predict(a, cluster, **{**kw, "schedule": "1f1b"})
    assert "split_backward" not in one_f1b.breakdown
    stages = virtual_stages(a, 4)
    calls = sum(frontier_nodes(b) for s in stages[1:] for b in s)
    assert plain.breakdown["split_backward"] == pytest.approx(calls * 1e-4 * 4 / 2)
    assert (
        ckpt.breakdown["split_backward"]
        > plain.breakdown["split_backward"] + 0.5 * (ckpt.breakdown["recompute"])
    )


def test_the_last_w_pass_is_where_zero_reduces():
    """ZeRO reduces once per step, in the rank's last weight pass (the one outside
    no_sync; megalith_pipeline's executor, tests/pipeline/test_split_w_once.py counts it)."""
    last = [last_weight_stage("zbv", 2, 4, r) for r in range(2)]
    assert last == [0, 1]  # rank 0 ends on the first stage (a whole backward)


def test_calibrate_measures_a_positive_call_cost_and_old_profiles_load(tmp_path):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as calibrate runs it on a CPU rank
    try:
        t = split_backward_call_s(torch.device("cpu"), reps=5)
    finally:
        torch.set_num_threads(threads)
    assert 0.0 <= t < 0.1, t  # 0.09 ms alone on the 2-core box, tens of ms under load
    data = cpu_like().to_json()
    del data["split_backward_call_s"]
    path = tmp_path / "old.json"
    path.write_text(json.dumps(data))
    assert MachineProfile.load(path).split_backward_call_s == 0.0
