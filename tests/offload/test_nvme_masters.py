"""fp32 masters on NVMe (OffloadConfig(master_tier="nvme")): an NVMe chunk's master lives
in its swap file ahead of its optimizer states, read and written with them around the
chunk's step, and nowhere else. Training must be bit-equal to ZeRO without offload (the
same kernel on the same numbers); the engine's accounting must show no host copy of
those masters; checkpoints (sharded, and full model plus full optimizer files) must see
and restore them; and the plan must count them with the files, not the host.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from megalith.testing import run_grid
from megalith_offload import ChunkCost, OffloadConfig, plan
from megalith_offload.placement import HOST_STEP_SLOTS, padded
from tests.offload.worker import Case, Resume, dispatch


def nvme(swap: str, **kwargs) -> Case:
    return Case(**{"stage": 2, "tier": "nvme", "master_tier": "nvme", "swap_dir": swap, **kwargs})


def cases(swap: str, world: int) -> list[Case]:
    out = [nvme(swap, stage=3, precision="bf16"), nvme(swap, stage=2, frac=0.5)]
    if world == 2:
        out += [
            nvme(swap),
            nvme(swap, stage=1),
            nvme(swap, stage=3),
            nvme(swap, precision="bf16", max_norm=0.5),
            # the host budget holds some chunks (with their masters); the rest go to NVMe
            nvme(swap, stage=3, tier="host+nvme", host_budget=40000, eager=True),
            # parameter shards in files of their own beside masters and states
            nvme(swap, stage=3, param_frac=0.5, param_tier="nvme"),
        ]
    return out


def resumes(swap: str, root: Path) -> list[Resume]:
    return [
        Resume(nvme(swap, stage=3), "sharded", str(root / "sharded")),
        Resume(nvme(swap, precision="bf16"), "full", str(root / "full")),
    ]


def baseline(case: Case) -> Case:
    return Case(stage=case.stage, precision=case.precision, max_norm=case.max_norm)


def same_as_baseline(what, got: dict, base: dict) -> None:
    assert not isinstance(got, tuple), f"{what}: {got}"
    assert got["losses"] == base["losses"], what
    for name, ref in base["params"].items():
        assert torch.equal(got["params"][name], ref), f"{what}: {name} differs"


def check_report(case: Case, r: dict) -> None:
    """The masters of NVMe chunks are in the files, only there."""
    rep, tiers = r["report"], r["tiers"]
    on_nvme, on_host = tiers.count("nvme"), tiers.count("host")
    assert on_nvme > 0, tiers
    assert rep["master@nvme"][0] > 0 and rep["master@nvme"][0] % 4096 == 0, rep
    # only host-tier chunks (host+nvme) keep their masters in host memory
    assert (rep["master@host"][0] > 0) == (on_host > 0), (case, rep, tiers)
    assert rep["optim_states@nvme"][0] > 0, rep


@pytest.mark.parametrize("world_size", [2, 3])
def test_nvme_masters_train_like_device_masters(world_size, tmp_path):
    """World 2 also runs the checkpoint cases (one process group for all)."""
    swap = str(tmp_path / "swap")
    trained = cases(swap, world_size)
    extra = resumes(swap, tmp_path) if world_size == 2 else []
    bases = sorted({baseline(c) for c in [*trained, *(r.case for r in extra)]}, key=str)
    grid = [*trained, *extra, *bases]
    results = dict(zip(grid, run_grid(dispatch, grid, world_size, timeout=240)))
    for case in trained:
        same_as_baseline(case, results[case][0], results[baseline(case)][0])
        for r in results[case]:
            assert r["swap_removed"], case
            check_report(case, r)
    for run in extra:  # checkpoint at step 10, load into other values, go on
        same_as_baseline(run, results[run][0], results[baseline(run.case)][0])
    assert not list(Path(swap).glob("megalith-swap-*")), "a swap directory was left behind"


def test_plan_counts_nvme_masters_with_the_files():
    costs = [ChunkCost(3000, 1000, 2000, 8192, step_staging=100)] * 4
    host_masters = plan(costs, OffloadConfig(tier="nvme"))
    p = plan(costs, OffloadConfig(tier="nvme", master_tier="nvme"))
    assert p.tiers == host_masters.tiers == ("nvme",) * 4
    file = 8192 + padded(1000)  # states, and the master ahead of them
    assert (p.nvme_bytes, p.slot_bytes) == (4 * file, file)
    # the host keeps the update's staging and two staging buffers, no masters
    assert p.host_bytes == HOST_STEP_SLOTS * 100 + 2 * file
    assert host_masters.host_bytes == 4 * 1000 + HOST_STEP_SLOTS * 100 + 2 * 8192
    # host+nvme: a chunk on the host costs its master and states there
    costs = [ChunkCost(3000, 4096, 8192, 8192, step_staging=100)] * 8
    file = 8192 + 4096
    budget = HOST_STEP_SLOTS * 100 + 2 * (4096 + 8192) + 2 * file
    both = OffloadConfig(tier="host+nvme", host_budget_bytes=budget, master_tier="nvme")
    mixed = plan(costs, both)
    assert mixed.tiers == ("host",) * 2 + ("nvme",) * 6
    assert mixed.host_bytes == budget and mixed.nvme_bytes == 6 * file


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"master_tier": "disk"}, "master_tier='disk'; expected 'host' or 'nvme'"),
        ({"master_tier": "nvme"}, "master_tier='nvme' with tier='host'.*use tier='nvme'"),
    ],
)
def test_config_refuses_nvme_masters_without_nvme_states(kwargs, message):
    with pytest.raises(ValueError, match=message):
        OffloadConfig(**kwargs)
