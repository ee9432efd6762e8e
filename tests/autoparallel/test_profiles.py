"""Profiles: JSON round trip, the built-in CI profile, cluster files, collective scaling,
and `megalith calibrate --quick --nproc 2` end to end."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest

from megalith.autoparallel import AlphaBeta, MachineProfile, load_cluster, load_profile
from megalith.autoparallel.profiles import ring_factor, scaled, with_group_sizes


def test_builtin_ci_profile_round_trips(tmp_path):
    p = load_profile("ci_cpu")
    assert p.device == "cpu" and p.transport == "gloo"
    path = tmp_path / "p.json"
    p.save(path)
    assert MachineProfile.load(path) == p == load_profile(path)


def test_builtin_h200_profile_is_the_measured_box_with_nvlink_groups():
    """h200.json: calibrate's figures from the lent H200 (benchmarks/results/autoparallel/
    2026-12-02_h200_calibrate.txt) and collectives at 2 (measured) and 8 GPUs (published)."""
    p = load_profile("h200")
    assert p.device == "cuda" and p.transport == "nccl" and p.devices_per_node == 8
    assert 5e14 < p.matmul["bf16"]["large"] < 9.9e14  # under the datasheet's dense peak
    assert 3e12 < p.memory_bandwidth < 4.8e12 and 2e10 < p.h2d_bandwidth < 6.4e10
    for op in ("all_reduce", "reduce_scatter", "all_gather"):
        assert set(p.collectives[op]) == {"2", "8"}
        # one NVLink-4 rate at 8 under the ring model: busbw 460 GB/s
        assert math.isclose(p.collectives[op]["8"].bandwidth * ring_factor(op, 8), 460e9)
    assert "PUBLISHED" in p.measured


def test_unknown_profile_names_the_fix():
    with pytest.raises(ValueError, match="megalith calibrate --out"):
        load_profile("no-such-machine")


def test_ring_scaling_from_the_largest_measured_group():
    p = load_profile("ci_cpu")
    measured = p.collectives["all_reduce"]["4"]
    at8 = scaled(p, "all_reduce", 8)
    # the per-link rate busbw = algbw * 2 (g - 1) / g is kept
    assert math.isclose(at8.bandwidth * 2 * 7 / 8, measured.bandwidth * 2 * 3 / 4)
    assert math.isclose(at8.latency_s, measured.latency_s * 7 / 3)
    assert scaled(p, "all_reduce", 4) == measured
    assert ring_factor("reduce_scatter", 8) == 7 / 8
    assert scaled(p, "broadcast", 8) == p.collectives["broadcast"]["4"]
    filled = with_group_sizes(p, [2, 8])
    assert filled.collectives["all_gather"]["8"] == scaled(p, "all_gather", 8)
    assert filled.collectives["all_gather"]["2"] == p.collectives["all_gather"]["2"]


def test_load_cluster(tmp_path):
    (tmp_path / "mine.json").write_text(json.dumps(load_profile("ci_cpu").to_json()))
    path = tmp_path / "cluster.json"
    path.write_text(
        json.dumps(
            {
                "profile": "mine.json",
                "nodes": 64,
                "gpus_per_node": 8,
                "inter_node": {"latency_s": 1e-5, "bandwidth": 4e11},
                "device_memory_bytes": 141e9,
            }
        )
    )
    c = load_cluster(path)
    assert (c.nodes, c.per_node, c.world) == (64, 8, 512)
    assert c.inter_node == AlphaBeta(1e-5, 4e11) and c.device_memory_bytes == 141 * 10**9
    assert set(c.profile.collectives["all_reduce"]) >= {"2", "4", "8"}
    path.write_text(json.dumps({"profile": "ci_cpu", "nodes": 2}))
    with pytest.raises(ValueError, match="need 'inter_node'"):
        load_cluster(path)
    path.write_text(json.dumps({"profile": "ci_cpu", "gpus": 2}))
    with pytest.raises(ValueError, match="unknown key"):
        load_cluster(path)


@pytest.mark.slow  # ~25 s on the 2-core CI box (spawns 2 ranks, times every measure)
@pytest.mark.timeout(90)
def test_megalith_calibrate_quick_end_to_end(tmp_path):
    out = tmp_path / "profile.json"
    cmd = [sys.executable, "-m", "megalith", "calibrate", "--quick", "--nproc", "2"]
    done = subprocess.run(
        [*cmd, "--device", "cpu", "--out", str(out), "--disk-dir", str(tmp_path)],
        capture_output=True, text=True, timeout=80, env={**os.environ, "OMP_NUM_THREADS": "1"},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert "all_reduce g=2" in done.stdout
    p = load_profile(out)
    figures = [
        p.memory_bandwidth, p.host_adam_params_per_s, p.h2d_bandwidth, p.d2h_bandwidth,
        p.disk_read_bandwidth, p.disk_write_bandwidth, *p.attention.values(),
        *(r for classes in p.matmul.values() for r in classes.values()),
        *(x for sizes in p.collectives.values() for ab in sizes.values()
          for x in (ab.latency_s, ab.bandwidth)),
    ]  # fmt: skip
    assert set(p.collectives) == {
        "all_reduce",
        "reduce_scatter",
        "all_gather",
        "broadcast",
        "send_recv",
        "all_to_all",
    }
    assert all(math.isfinite(x) and x > 0 for x in figures)
