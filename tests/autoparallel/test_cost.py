"""The cost model on hand-built analyses (tests/autoparallel/handmade.py): monotonic in the
obvious directions, the pipeline's bubble from the simulator, and the model state of
dp-only ZeRO plans equal to megalith_zero.estimate's."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest
import torch

from megalith.autoparallel import AlphaBeta
from megalith.autoparallel.cost import predict
from megalith.autoparallel.knobs import Knobs
from megalith.autoparallel.memory import peak_memory

from .handmade import cpu_like, gpt_analysis, h200_cluster

pytestmark = pytest.mark.timeout(60)


def _analysis(rng: random.Random, **kw):
    return gpt_analysis(
        hidden=rng.choice((512, 768, 1024)), layers=rng.choice((4, 8, 12)), heads=8, **kw
    )


def test_step_time_grows_with_the_work():
    rng = random.Random()
    a, c = _analysis(rng), h200_cluster()
    b = rng.choice((1, 2, 4))
    one = predict(a, c, dp=8, micro_batch=b)
    two = predict(a, c, dp=8, micro_batch=b, num_microbatches=2)
    bigger = predict(a, c, dp=8, micro_batch=2 * b)
    assert two.breakdown["compute"] == pytest.approx(2 * one.breakdown["compute"])
    assert two.predicted_step_s > one.predicted_step_s
    assert bigger.predicted_step_s > one.predicted_step_s
    assert two.predicted_tokens_per_s == pytest.approx(8 * b * 2 * a.seq_len / two.predicted_step_s)
    assert 0 < one.predicted_mfu < 1


def test_checkpointing_trades_recompute_for_memory():
    rng = random.Random()
    a, c = _analysis(rng), h200_cluster()
    plain = predict(a, c, dp=8, zero_stage=1, micro_batch=4)
    half = predict(a, c, dp=8, zero_stage=1, micro_batch=4, ckpt=0.5)
    full = predict(a, c, dp=8, zero_stage=1, micro_batch=4, ckpt=1.0)
    assert plain.predicted_step_s < half.predicted_step_s < full.predicted_step_s
    assert plain.predicted_peak_bytes > half.predicted_peak_bytes > full.predicted_peak_bytes
    # the recompute is one more forward of the checkpointed layers: at most the whole
    # forward (a third of compute: backward is twice it), and the layers are alike, so half
    # of them checkpointed recompute half as long
    assert 0 < full.breakdown["recompute"] <= full.breakdown["compute"] / 3 * (1 + 1e-9)
    layers = len(a.blocks)
    assert half.breakdown["recompute"] == pytest.approx(
        full.breakdown["recompute"] * round(layers / 2) / layers, rel=1e-6
    )


def test_zero_stages_and_offload_lower_the_peak():
    rng = random.Random()
    # a small vocabulary: stage 3 gathers its largest block whole, here a layer
    a, c = _analysis(rng, vocab=1024), h200_cluster()
    peaks = [predict(a, c, dp=8, zero_stage=s).predicted_peak_bytes for s in (1, 2, 3)]
    assert peaks[0] > peaks[1] > peaks[2]
    kept = predict(a, c, dp=8, zero_stage=2)
    off = predict(a, c, dp=8, zero_stage=2, offload="host", offload_fraction=1.0)
    assert off.predicted_peak_bytes < kept.predicted_peak_bytes
    assert off.breakdown["host_step"] > 0 and off.breakdown["optimizer"] == 0


def test_tensor_parallelism_shards_compute_and_pays_all_reduces():
    rng = random.Random()
    a, c = _analysis(rng), h200_cluster()
    dp = predict(a, c, dp=8, micro_batch=4)
    tp = predict(a, c, dp=4, tp=2, micro_batch=4)
    assert tp.breakdown["compute"] < 0.7 * dp.breakdown["compute"]
    assert tp.breakdown["tp_comm"] > 0
    assert dp.breakdown["tp_comm"] == 0.0


def test_pipeline_bubble_is_the_simulators():
    from megalith.autoparallel.stages import virtual_stages
    from megalith_pipeline.schedules import make_schedule
    from megalith_pipeline.simulator import PassTimes, simulate

    rng = random.Random()
    pp, m = 4, rng.choice((4, 8, 16))
    # a tiny vocabulary: the embedding and the head cost nothing, the layers all the same
    a = gpt_analysis(hidden=1024, layers=8, heads=8, vocab=8)
    c = h200_cluster()
    free = {"send_recv": {"2": AlphaBeta(0.0, 1e30)}}  # messages cost nothing here
    c = replace(c, profile=replace(c.profile, collectives={**c.profile.collectives, **free}))
    got = predict(a, c, dp=2, pp=pp, num_microbatches=m, schedule="1f1b")
    busy = got.breakdown["compute"]
    span = busy + got.breakdown["pp_bubble_and_p2p"]
    # megalith_pipeline cuts [embedding, 8 layers, head] evenly: 2, 3, 2, 1 layers a stage,
    # so the bubble is at least uniform 1F1B's (p - 1) / (m + p - 1)
    layers = [sum(b is not a.pre and b is not a.post for b in s) for s in virtual_stages(a, pp)]
    assert layers == [2, 3, 2, 1]
    assert 1 - busy / span >= (pp - 1) / (m + pp - 1) - 0.01
    one = busy / m * pp / (3 * len(a.blocks))  # forward of one layer per micro-batch
    times = [PassTimes(forward=n * one, backward=2 * n * one) for n in layers]
    t = simulate(make_schedule("1f1b", pp, m), times)
    assert span == pytest.approx(t.makespan, rel=0.03)
    zbv = predict(a, c, dp=2, pp=pp, num_microbatches=m, schedule="zbv")
    assert zbv.breakdown["pp_bubble_and_p2p"] < got.breakdown["pp_bubble_and_p2p"]


def test_cpu_profile_plans_in_fp32():
    a = gpt_analysis(hidden=256, layers=4, heads=4, seq_len=128, vocab=1024)
    from megalith.autoparallel import Cluster

    c = Cluster(profile=cpu_like())
    got = predict(a, c, dp=4, precision="fp32")
    assert got.predicted_step_s > 0 and got.breakdown["dp_reduce"] >= 0


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_dp_only_model_state_is_megalith_zeros_estimate(stage):
    from megalith import models
    from megalith.autoparallel import analyze
    from megalith.strategy import Strategy
    from megalith_zero.estimate import estimate

    dp = random.choice((2, 4, 8))
    with torch.device("meta"):
        model = models.create("gpt-tiny")
    a = analyze(model, 64)
    knobs = Knobs(dp=dp, zero_stage=stage, precision="bf16")
    mem = peak_memory(a, h200_cluster(), knobs, model)
    plugin = {1: "zero1", 2: "zero2", 3: "gemini"}[stage]
    config = Strategy(plugin=plugin, precision="bf16").zero_config()
    e = estimate(model, torch.optim.AdamW(model.parameters()), config, dp)
    state = mem.params + mem.grads + mem.grads_in_flight + mem.gathered + mem.optimizer
    assert state == e.device_bytes
    assert mem.activations > 0
