"""Stage-3 parameter shards on NVMe (OffloadConfig(param_tier="nvme")): each such chunk's
working-parameter shard lives in a swap file of its own, read into host staging for
every gather and written by the host update. Training must be bit-equal to ZeRO
without offload (the same kernel on the same numbers), the shards must really be in
the files (no host or device copy), checkpoints must see and restore them, and
configurations that cannot work must fail before any collective, naming the fix.

Checkpoints: save_sharded/load_sharded, and save_full + save_full_optimizer /
load_full + load_full_optimizer, at step 10 into a model of other initial values, then
10 more steps: bit-equal to the uninterrupted run.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from megalith.testing import run_grid
from megalith_core.memory import StateMemory
from megalith_offload import ChunkCost, OffloadConfig, SwapStore, plan
from megalith_offload.placement import PARAM_SWAP_SLOTS, padded
from tests.offload.worker import Case, Refused, Resume, dispatch


def nvme(swap: str, frac: float = 1.0, **kwargs) -> Case:
    return Case(stage=3, tier="nvme", param_frac=frac, param_tier="nvme", swap_dir=swap, **kwargs)


def cases(swap: str, world: int) -> list[Case]:
    if world == 3:
        return [nvme(swap, 0.5, precision="bf16")]
    return [
        nvme(swap, prefetch=3),  # more reads ahead than staging buffers
        nvme(swap, 0.5),
        nvme(swap, precision="bf16"),
        # the host budget holds some chunks' states (updated during backward); the
        # parameter chunks keep theirs on NVMe
        Case(
            stage=3,
            tier="host+nvme",
            host_budget=80000,
            param_frac=0.5,
            param_tier="nvme",
            swap_dir=swap,
            eager=True,
        ),
    ]


def resumes(swap: str, root: Path) -> list[Resume]:
    return [
        Resume(nvme(swap, 0.5), "sharded", str(root / "sharded")),
        Resume(nvme(swap, precision="bf16"), "full", str(root / "full")),
    ]


def refusals(swap: str) -> list[Refused]:
    return [
        Refused(Case(stage=2, tier="nvme", param_frac=1.0, param_tier="nvme", swap_dir=swap)),
        # half the chunks keep their states on the device: their parameters cannot go
        Refused(
            Case(stage=3, tier="nvme", frac=0.5, param_frac=1.0, param_tier="nvme", swap_dir=swap)
        ),
    ]


def baseline(case: Case) -> Case:
    return Case(stage=case.stage, precision=case.precision)


def check_files(case: Case, r: dict) -> None:
    """The shards of parameter chunks are in files, nowhere else."""
    shards = r["param_shards"]
    in_files = [nbytes for on_nvme, nbytes, _ in shards if on_nvme]
    on_device = [nbytes for on_nvme, nbytes, _ in shards if not on_nvme]
    assert len(in_files) == -(-len(shards) * case.param_frac // 1), shards
    assert all(dev == "meta" for on_nvme, _, dev in shards if on_nvme)  # no values held
    rep = r["report"]
    assert rep["params@nvme"][0] == sum(padded(n) for n in in_files)  # whole 4 KiB blocks
    assert rep["params"][0] == sum(on_device)  # the device holds only the other shards
    assert "params@host" not in rep  # no host copy of a shard
    staging = PARAM_SWAP_SLOTS * max(padded(n) for n in in_files)
    assert rep["param_swap_staging@host"] == (staging, staging)  # the ring, never more


@pytest.mark.parametrize("world_size", [2, 3])
def test_nvme_parameters_train_like_device_parameters(world_size, tmp_path):
    """World 2 also runs the checkpoint and refusal cases (one process group for all)."""
    swap = str(tmp_path / "swap")
    trained = cases(swap, world_size)
    extra = [*resumes(swap, tmp_path), *refusals(swap)] if world_size == 2 else []
    bases = sorted({baseline(c) for c in trained}, key=str)
    grid = [*trained, *extra, *bases]
    results = dict(zip(grid, run_grid(dispatch, grid, world_size, timeout=240)))
    for case in trained:
        per_rank = results[case]
        first = per_rank[0]
        assert not isinstance(first, tuple), f"{case}: {first}"
        same_as_baseline(case, first, results[baseline(case)][0])
        for r in per_rank:
            assert r["swap_removed"], case
            check_files(case, r)
    for run in extra:
        if isinstance(run, Resume):  # checkpoint at step 10, load into other values, on
            same_as_baseline(run, results[run][0], results[baseline(run.case)][0])
    if extra:
        check_refusals(*(results[r] for r in extra if isinstance(r, Refused)))
    assert not list(Path(swap).glob("megalith-swap-*")), "a swap directory was left behind"


def same_as_baseline(what, got: dict, base: dict) -> None:
    assert got["losses"] == base["losses"], what
    for name, ref in base["params"].items():
        assert torch.equal(got["params"][name], ref), f"{what}: {name} differs"


def check_refusals(stage2: list, device_states: list) -> None:
    """Refused before shard()'s first collective: every rank kept its own parameters."""
    for message, untouched in stage2:
        assert "at stage 2" in message and "use stage=3" in message, message
        assert untouched
    for message, untouched in device_states:
        assert "keeps its optimizer states on the device" in message, message
        assert "optim_frac >= param_frac" in message and "lower param_frac" in message
        assert untouched


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"param_tier": "disk"}, "param_tier='disk'; expected 'host' or 'nvme'"),
        (
            {"param_tier": "nvme", "param_frac": 1.0},
            "param_tier='nvme' with tier='host'.*use tier='nvme'",
        ),
        ({"param_tier": "nvme", "tier": "nvme"}, "param_frac=0.*set param_frac"),
    ],
)
def test_config_refuses_parameters_on_nvme_without_their_states(kwargs, message):
    with pytest.raises(ValueError, match=message):
        OffloadConfig(**kwargs)


def test_plan_counts_parameter_files_and_their_staging():
    costs = [ChunkCost(3000, 1000, 2000, 8192, step_staging=100, params=5000)] * 4
    p = plan(costs, OffloadConfig(tier="nvme", param_frac=0.5, param_tier="nvme"))
    assert p.params_on_nvme == (True, True, False, False) and not any(p.params_on_host)
    assert (p.param_slots, p.param_slot_bytes) == (PARAM_SWAP_SLOTS, 8192)
    assert p.nvme_bytes == 4 * 8192 + 2 * 8192  # states' files and two parameter files
    # masters, the host update's staging, the parameter ring, the states' staging
    assert p.host_bytes == 4 * 1000 + 3 * 100 + 2 * 8192 + 2 * 8192
    # host+nvme: the budget fills with the other chunks; parameter chunks stay on NVMe
    roomy = OffloadConfig(
        tier="host+nvme", host_budget_bytes=10**6, param_frac=0.5, param_tier="nvme"
    )
    assert plan(costs, roomy).tiers == ("nvme", "nvme", "host", "host")


def test_parameter_ring_finishes_a_holder_before_reusing_its_buffer(tmp_path):
    host = StateMemory.host(pinned=False)
    cfg = OffloadConfig(tier="nvme", swap_dir=str(tmp_path), run_name="unit")
    store = SwapStore(cfg, 0, host, 1, 4096, param_slots=2, param_slot_bytes=8192)
    files = store.params
    values = {k: torch.arange(1000 + k, dtype=torch.bfloat16) for k in range(3)}
    for k, v in values.items():
        files.ensure(k, v.numel(), v.dtype)
        files.store(k, v)
    finished = []
    reads = {k: files.start_read(k, holder=lambda k=k: finished.append(k)) for k in (0, 1)}
    assert finished == [] and torch.equal(reads[1].wait(), values[1])
    files.start_read(2)  # the ring has two buffers: the first read's holder must finish
    assert finished == [0]
    with files.staged(1) as view:  # read, changed, written back
        assert torch.equal(view, values[1])
        view.mul_(2)
    assert torch.equal(files.load(1), values[1] * 2)
    assert store.report()["params@nvme"][0] == 3 * 4096
    assert host.report()["param_swap_staging"][0] == 2 * 8192
    store.close()
    assert not Path(store.path).exists()


class _LateWrites:
    """A swap file whose writes land only when waited for: the slowest disk allowed."""

    def __init__(self, file):
        self.file, self.nbytes = file, file.nbytes

    def read(self, buf):
        return self.file.read(buf)

    def write(self, buf):
        return _Deferred(lambda: self.file.write(buf).wait())


class _Deferred:
    def __init__(self, work):
        self.work = work

    def wait(self):
        work, self.work = self.work, None
        if work is not None:
            work()


def test_parameter_read_waits_for_the_write_back_of_its_file(tmp_path):
    """A write-back from one staging buffer is still in flight when the next read of
    the same file starts into the other buffer: the read must see the written values."""
    host = StateMemory.host(pinned=False)
    cfg = OffloadConfig(tier="nvme", swap_dir=str(tmp_path), run_name="unit")
    store = SwapStore(cfg, 0, host, 1, 4096, param_slots=2, param_slot_bytes=8192)
    files = store.params
    expected = torch.randn(1500)
    files.ensure(0, expected.numel(), torch.float32)
    files.store(0, expected)
    file, numel, dtype = files._files[0]
    files._files[0] = (_LateWrites(file), numel, dtype)
    for step in range(4):
        with files.staged(0) as view:
            view.add_(step + 1)
        expected.add_(step + 1)
        assert torch.equal(files.start_read(0).wait(), expected), step
    store.close()
