"""Every pipeline pass's fixed cost in the cost model: the passes a rank runs, counted
from megalith_pipeline's schedule (against the executor's own passes on one rank and the
schedules' orders at pp 2 and 4), charged the profile's `pipeline_pass_s` each; and
calibrate's micro-benchmark of that cost, and the key read from profiles."""

from __future__ import annotations

import json
import random
from types import SimpleNamespace

import pytest
import torch

from megalith import models
from megalith.autoparallel import analyze, predict
from megalith.autoparallel.calibrate_pass import pipeline_pass_s
from megalith.autoparallel.knobs import PIPELINE_NAMES
from megalith.autoparallel.profiles import load_profile
from megalith.autoparallel.stages import passes_per_rank
from megalith.autoparallel.types import Cluster, MachineProfile
from megalith_pipeline import StageModule, make_schedule
from megalith_pipeline.channels import Channels
from megalith_pipeline.executor import Executor

from .handmade import cpu_like

CFG = dict(d_model=64, n_layers=4, n_heads=4, d_ff=256, vocab_size=256, max_seq_len=64)
SEQ = 32


@pytest.mark.parametrize("name", sorted(PIPELINE_NAMES))
def test_the_count_is_the_passes_the_executor_runs(name):
    m = random.randint(2, 6)
    sched = make_schedule(PIPELINE_NAMES[name], 1, m)
    layers = [torch.nn.Linear(4, 4) for _ in range(sched.num_stages)]
    stages = {s: StageModule([layers[s]], s, s) for s in range(sched.num_stages)}
    channels = Channels(sched, SimpleNamespace(size=1, rank=0), torch.device("cpu"))
    executor = Executor(sched, 0, stages, channels, torch.nn.functional.mse_loss)
    xs = [torch.randn(2, 4) for _ in range(m)]
    ys = [torch.randn(2, 4) for _ in range(m)]
    _, _, stats = executor.run(xs, ys, [1.0 / m] * m)
    assert passes_per_rank(name, 1, m) == (len(stats.spans),)
    per_mb = 3 if name == "zbv" else 2  # F and B; under a split backward F, I and W
    assert len(stats.spans) == sched.num_stages * m * per_mb


@pytest.mark.parametrize("name", sorted(PIPELINE_NAMES))
@pytest.mark.parametrize("pp", [2, 4])
def test_the_count_scales_past_the_simulated_microbatches(name, pp):
    m = pp * random.randint(3, 6)  # more than stages.simulated_microbatches keeps
    sched = make_schedule(PIPELINE_NAMES[name], pp, m)
    assert passes_per_rank(name, pp, m) == tuple(len(o) for o in sched.orders)


def test_the_model_charges_every_pass_on_the_busiest_rank():
    a = analyze(models.create("gpt-tiny", device="meta", **CFG), SEQ, precision="fp32")
    prof = cpu_like()
    pass_s = 2e-3
    charged = Cluster(profile=MachineProfile(**{**prof.__dict__, "pipeline_pass_s": pass_s}))
    free = Cluster(profile=MachineProfile(**{**prof.__dict__, "pipeline_pass_s": 0.0}))
    for schedule in ("1f1b", "interleaved", "zbv"):
        m = 8
        kw = dict(dp=2, pp=2, num_microbatches=m, precision="fp32", schedule=schedule)
        with_cost, without = predict(a, charged, **kw), predict(a, free, **kw)
        passes = max(passes_per_rank(schedule, 2, m))
        assert with_cost.breakdown["pipeline_passes"] == pytest.approx(passes * pass_s)
        assert "pipeline_passes" not in without.breakdown
        # the busiest rank runs every one of its passes: the step grows by at least them
        # (the simulator's 2-decimal rounding of stage-time ratios aside)
        grown = with_cost.predicted_step_s - without.predicted_step_s
        assert 0.9 * passes * pass_s <= grown <= 2.0 * passes * pass_s, (schedule, grown)
    flat = predict(a, charged, dp=4, num_microbatches=m, precision="fp32")
    assert "pipeline_passes" not in flat.breakdown  # no pipeline, no passes


def test_calibrate_measures_a_pass_and_profiles_carry_the_key(tmp_path):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as calibrate runs it on a CPU rank
    try:
        t = pipeline_pass_s(torch.device("cpu"), reps=3)
    finally:
        torch.set_num_threads(threads)
    assert 0.0 < t < 0.05, t  # 0.085 ms alone on the 2-core box, more under load
    assert load_profile("ci_cpu").pipeline_pass_s > 0.0  # measured
    assert load_profile("h200").pipeline_pass_s == 0.0  # not measured
    data = cpu_like().to_json()
    del data["pipeline_pass_s"]
    path = tmp_path / "old.json"
    path.write_text(json.dumps(data))
    assert MachineProfile.load(path).pipeline_pass_s == 0.0
