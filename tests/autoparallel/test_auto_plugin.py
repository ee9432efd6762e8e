"""AutoPlugin (`Booster(plugin="auto")`) on CPU ranks: whatever the planner chooses, the
losses equal the plain single-process run on the same data (fp32: 1e-5 relative, as the
other plugins' tests); a device budget just under the free choice's predicted peak makes
it choose something smaller that still matches; every rank runs the same plan, and ranks
given different models fail at the plan instead of hanging."""

from __future__ import annotations

import random

import pytest

from megalith.testing import run_distributed, run_grid
from tests.support.gpu import gpu

from .auto_workers import BATCH, SEQ, Setting, auto_train, odd_model_on_rank_1, plain_losses

pytestmark = pytest.mark.timeout(240)

KEYS = (
    "dp", "tp", "pp", "sp", "zero_stage", "offload", "micro_batch", "num_microbatches", "ckpt",
    "schedule", "predicted_step_s", "predicted_tokens_per_s", "predicted_peak_bytes",
)  # fmt: skip


def close(a: list[float], b: list[float], rel: float) -> bool:
    return len(a) == len(b) and all(abs(x - y) <= rel * abs(y) for x, y in zip(a, b))


@pytest.mark.parametrize("world_size", [2, 4])
def test_auto_matches_plain_torch_whatever_it_chose(world_size):
    seed = random.randrange(1000)
    reference = plain_losses(seed)
    assert reference[-1] < reference[0], f"the model did not learn: {reference}"
    dp_only = {"constraints": {"tp": 1, "sp": 1, "ckpt": 0.0}}
    settings = [
        Setting(seed),
        Setting(seed, budget="tight"),
        Setting(seed, budget="tight", kwargs=dp_only),  # left only ZeRO or offload
        Setting(seed, by_name=True),
        Setting(seed, kwargs={"constraints": {"tp": 2, "zero_stage": 2}}),  # tp x ZeRO-2
    ]
    roomy, tight, sharded, by_name, tp2 = run_grid(auto_train, settings, world_size, timeout=200)
    assert by_name[0]["plan"]["chosen"]["dp"] == world_size  # the loader's replicas
    assert tp2[0]["plan"]["chosen"]["plugin"] == "hybrid"
    for runs in (roomy, tight, sharded, by_name, tp2):
        plans = [r["plan"] for r in runs]
        assert all(p == plans[0] for p in plans), "ranks ran different plans"
        chosen = plans[0]["chosen"]
        assert set(KEYS) <= set(chosen) and all(set(KEYS) <= set(c) for c in plans[0]["candidates"])
        assert chosen["dp"] * chosen["tp"] * chosen["pp"] * chosen["sp"] == world_size
        assert chosen["dp"] * chosen["micro_batch"] * chosen["num_microbatches"] == BATCH
        assert plans[0]["global_batch_tokens"] == BATCH * SEQ
        losses = runs[0]["losses"]
        assert close(losses, reference, 1e-5), f"{chosen['plugin']}: {losses} vs {reference}"
    free, forced = roomy[0]["plan"]["chosen"], tight[0]["plan"]["chosen"]
    budget = tight[0]["budget"] * 1e9
    assert forced["predicted_peak_bytes"] <= budget < free["predicted_peak_bytes"]
    differs = ("plugin", "tp", "zero_stage", "offload", "offload_fraction", "ckpt", "micro_batch")
    assert any(forced[k] != free[k] for k in differs), (free, forced)
    zero = sharded[0]["plan"]["chosen"]
    assert zero["predicted_peak_bytes"] <= sharded[0]["budget"] * 1e9
    assert zero["zero_stage"] > 0 or zero["offload"] != "none", zero


def test_ranks_with_different_models_fail_at_the_plan():
    seed = random.randrange(1000)
    messages = run_distributed(odd_model_on_rank_1, 2, seed, timeout=60)
    assert all("rank(s) [1]" in m and "another model" in m for m in messages), messages


def _candidate(**knobs):
    from megalith.autoparallel import Candidate

    base = dict(dp=1, tp=1, pp=1, sp=1, zero_stage=0, offload="none", offload_fraction=0.0)
    base |= dict(micro_batch=1, num_microbatches=1, ckpt=0.0, schedule="none")
    base |= dict(predicted_step_s=1.0, predicted_tokens_per_s=1.0, predicted_peak_bytes=1)
    return Candidate(**{**base, **knobs}, predicted_mfu=0.5)


def test_each_candidate_becomes_the_strategy_that_runs_it():
    from megalith.booster.plugin.auto_plan import strategy_of

    s = strategy_of(
        _candidate(dp=4, zero_stage=2, offload="host", offload_fraction=0.5), "fp32", 1.0
    )
    assert (s.plugin, s.zero_stage, s.offload.tier, s.offload.optim_frac, s.max_norm) == (
        "zero2", 2, "host", 0.5, 1.0,
    )  # fmt: skip
    assert strategy_of(_candidate(dp=2, zero_stage=3), "bf16", 0.0).plugin == "gemini"
    assert strategy_of(_candidate(dp=2), "bf16", 0.0).plugin == "ddp"
    piped = _candidate(tp=2, pp=2, zero_stage=1, num_microbatches=4, schedule="interleaved")
    s = strategy_of(piped, "bf16", 0.0)
    p = s.parallel
    assert (s.plugin, s.zero_stage, p.tp, p.pp, p.pp_style, p.num_model_chunks) == (
        "hybrid", 1, 2, 2, "interleaved", 2,
    )  # fmt: skip
    assert p.num_microbatches == 4
    ulysses = strategy_of(
        _candidate(sp=2, zero_stage=1, offload="host", offload_fraction=1.0), "fp32", 0.0
    )
    assert (ulysses.parallel.sp, ulysses.parallel.sequence_parallelism) == (2, "all_to_all")
    assert ulysses.offload.tier == "host"


def test_profiles_clusters_and_arguments_fail_with_the_fix(monkeypatch, tmp_path):
    from megalith.autoparallel import profiles
    from megalith.booster import AutoPlugin
    from megalith.booster.plugin.auto_plan import choose_profile, live_cluster

    assert choose_profile("cpu").device == "cpu"
    monkeypatch.setenv("MEGALITH_PROFILE", str(profiles.BUILTIN_DIR / "ci_cpu.json"))
    assert choose_profile("cuda").device == "cpu"  # the named profile wins
    monkeypatch.delenv("MEGALITH_PROFILE")
    monkeypatch.setattr(profiles, "default_profile_path", lambda: tmp_path / "none.json")
    monkeypatch.setattr(profiles, "builtin_profiles", lambda: ["ci_cpu"])
    with pytest.raises(ValueError, match="megalith calibrate"):
        choose_profile("cuda")
    cpu = choose_profile("cpu")
    cluster = live_cluster(cpu, 4, 4, device_budget_gb=0.5)
    assert (cluster.world, cluster.device_memory_bytes) == (4, 500_000_000)
    assert "4" in cluster.profile.collectives["all_reduce"]
    with pytest.raises(ValueError, match="runs 2 ranks"):
        live_cluster(cpu, 2, 2, cluster=cluster)
    with pytest.raises(TypeError, match="unknown constraint"):
        AutoPlugin(constraints={"tensor": 2})
    with pytest.raises(ValueError, match="seq_len=0"):
        AutoPlugin(seq_len=0)
    with pytest.raises(ValueError, match="device_budget_gb"):
        live_cluster(cpu, 2, 2, device_budget_gb=-1)
    with pytest.raises(RuntimeError, match=r"call booster\.boost"):
        AutoPlugin().plan  # noqa: B018


def _gpu_profile() -> bool:
    from megalith.autoparallel import profiles

    return profiles.default_profile_path().is_file() or "h200" in profiles.builtin_profiles()


@gpu
def test_auto_on_one_gpu_matches_plain_torch_in_bf16():
    if not _gpu_profile():
        pytest.skip("no GPU machine profile: run `megalith calibrate` (or add the h200 built-in)")
    seed = random.randrange(1000)
    reference = plain_losses(seed)
    run = run_distributed(
        auto_train, 1, Setting(seed, kwargs={"precision": "bf16"}), backend="nccl", timeout=200
    )[0]
    chosen = run["plan"]["chosen"]
    assert run["plan"]["precision"] == "bf16" and chosen["dp"] == 1
    assert close(run["losses"], reference, 3e-2), (
        f"{chosen['plugin']}: {run['losses']} vs {reference}"
    )
