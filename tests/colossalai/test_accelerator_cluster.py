"""megalith.accelerator on CPU, and megalith.cluster's DistCoordinator and ProcessGroupMesh
on 2 and 3 CPU ranks, used as ColossalAI's examples and tests use them."""

from __future__ import annotations

import contextlib
import io
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

import megalith_comm as comm
from megalith.accelerator import (
    CpuAccelerator,
    get_accelerator,
    set_accelerator,
)
from megalith.accelerator import api as accelerator_api
from megalith.cluster import (
    DeviceMeshManager,
    DistCoordinator,
    ProcessGroupManager,
    ProcessGroupMesh,
)
from megalith.testing import run_distributed

cpu_only = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU accelerator")


@pytest.fixture
def fresh_accelerator():
    accelerator_api._ACCELERATOR = None
    yield
    accelerator_api._ACCELERATOR = None


@cpu_only
def test_cpu_accelerator_device_and_seeds(fresh_accelerator, gen):
    acc = get_accelerator()
    assert isinstance(acc, CpuAccelerator) and acc is get_accelerator()
    assert (acc.name, acc.communication_backend, acc.support_set_device) == ("cpu", "gloo", False)
    assert acc.get_current_device() == torch.device("cpu")
    assert (acc.current_device(), acc.device_count(), acc.is_available()) == (0, 1, True)
    acc.set_device(None)
    acc.synchronize()
    acc.empty_cache()
    assert isinstance(acc.get_device_name(), str) and acc.get_device_name()
    model = acc.set_to_device(torch.nn.Linear(3, 2))
    assert next(model.parameters()).device.type == "cpu"
    with pytest.raises(ValueError, match="runs on CPU"):
        acc.set_device("cuda:0")
    with pytest.raises(RuntimeError, match="name == 'cuda'"):
        acc.get_device_capability()

    seed = int(torch.randint(0, 2**31, (1,), generator=gen))
    acc.manual_seed(seed)
    drawn = torch.rand(5)
    torch.manual_seed(seed)
    assert torch.equal(drawn, torch.rand(5))
    assert acc.initial_seed() == seed
    state = acc.get_rng_state()
    a = torch.randn(4)
    acc.set_rng_state(state)
    assert torch.equal(a, torch.randn(4))
    acc.set_rng_state_all(acc.get_rng_state_all())


@cpu_only
def test_cpu_accelerator_memory_is_the_process_resident_set(fresh_accelerator, gen):
    acc = get_accelerator()
    with open("/proc/self/statm") as f:
        statm = int(f.read().split()[1]) * 4096
    before = acc.memory_allocated()
    assert abs(before - statm) < 64 * 2**20  # the same figure, give or take the interpreter
    n = 64 * 2**20 // 4
    big = torch.rand(n, generator=gen)  # 64 MiB, touched
    grown = acc.memory_allocated()
    assert grown - before > 48 * 2**20
    assert acc.max_memory_allocated() >= grown and acc.memory_reserved() >= grown - 2**20
    peak = acc.max_memory_reserved()
    del big
    acc.reset_peak_memory_stats()
    after = acc.max_memory_allocated()
    assert after < peak - 32 * 2**20  # the peak starts again from now
    stats = acc.memory_stats()
    assert stats["allocated_bytes.all.peak"] >= stats["allocated_bytes.all.current"] > 0
    assert "MiB" in acc.memory_summary() and acc.memory_snapshot() == []


@cpu_only
def test_cpu_accelerator_streams_events_autocast(fresh_accelerator, gen):
    acc = get_accelerator()
    start, end = acc.Event(enable_timing=True), acc.Event(enable_timing=True)
    start.record()
    time.sleep(0.05)
    end.record()
    end.synchronize()
    assert 40.0 <= start.elapsed_time(end) < 5000.0 and end.query()
    with pytest.raises(RuntimeError, match="enable_timing"):
        acc.Event().elapsed_time(acc.Event())
    side = acc.Stream()
    assert acc.current_stream() is acc.default_stream()
    with acc.stream(side):
        assert acc.current_stream() is side
        side.wait_stream(acc.default_stream())
    assert acc.current_stream() is acc.default_stream()

    x = torch.randn(8, 16, generator=gen)
    w = torch.randn(16, 4, generator=gen)
    with acc.autocast(dtype=torch.bfloat16):
        y = x @ w
    assert y.dtype == torch.bfloat16
    torch.testing.assert_close(y.float(), x @ w, rtol=0.05, atol=0.1)
    with acc.autocast(enabled=False):
        assert (x @ w).dtype == torch.float32


def test_set_accelerator(fresh_accelerator):
    set_accelerator("cpu")
    assert get_accelerator().name == "cpu"
    mine = CpuAccelerator()
    set_accelerator(mine)
    assert get_accelerator() is mine
    with pytest.raises(NotImplementedError, match="NPU"):
        set_accelerator("npu")
    with pytest.raises(ValueError, match="expected one of"):
        set_accelerator("tpu")
    with pytest.raises(TypeError):
        set_accelerator(3)
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="set_accelerator\\('cpu'\\)"):
            set_accelerator("cuda")


@cpu_only
def test_set_per_process_memory_fraction_caps_the_address_space():
    code = (
        "import resource; from megalith.accelerator import get_accelerator, host_memory;"
        "get_accelerator().set_per_process_memory_fraction(0.9);"
        "soft, _ = resource.getrlimit(resource.RLIMIT_AS);"
        "assert soft == int(host_memory.total() * 0.9), soft"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
    with pytest.raises(ValueError, match="fraction"):
        get_accelerator().set_per_process_memory_fraction(1.5)


def test_cluster_needs_a_process_group():
    if comm.is_initialized() or torch.distributed.is_initialized():
        pytest.skip("a process group is up in this process")
    for make in (DistCoordinator, lambda: ProcessGroupMesh(1)):
        with pytest.raises(RuntimeError, match="launch_from_torch"):
            make()
    with pytest.raises(NotImplementedError, match="ProcessGroupMesh"):
        DeviceMeshManager()


@pytest.mark.parametrize("shape", [(2, 3, 4), (1, 5), (3,)])
def test_ravel_unravel_match_numpy(shape):
    for rank in range(int(np.prod(shape))):
        coord = ProcessGroupMesh.unravel(rank, shape)
        assert coord == tuple(int(c) for c in np.unravel_index(rank, shape))
        assert ProcessGroupMesh.ravel(coord, shape) == rank
    big = tuple(s + 1 for s in shape)
    for mode in ("wrap", "clip"):
        assert ProcessGroupMesh.ravel(big, shape, mode) == int(
            np.ravel_multi_index(big, shape, mode=mode)
        )
    with pytest.raises(ValueError, match="outside"):
        ProcessGroupMesh.ravel(big, shape)


def coordinator_and_mesh(rank: int, tmp: str) -> dict:
    n = comm.get_world().world_size
    out: dict = {}
    coordinator = DistCoordinator()
    assert coordinator is DistCoordinator()  # one per process
    out["who"] = (coordinator.rank, coordinator.world_size, coordinator.local_rank)
    out["flags"] = (
        coordinator.is_master(),
        coordinator.is_node_master(),
        coordinator.is_last_process(),
    )
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        coordinator.print_on_master(f"master says {rank}")
        coordinator.print_on_node_master(f"node master says {rank}")
    out["printed"] = printed.getvalue()

    @coordinator.on_master_only()
    def square(x: int) -> int:
        return x * x

    out["on_master_only"] = square(rank + 3)

    # priority_execution: the executor runs its body before anyone else enters theirs.
    log = f"{tmp}/order.log"
    with coordinator.priority_execution(executor_rank=n - 1):
        with open(log, "a") as f:
            f.write(f"{rank}\n")
    coordinator.block_all()
    with open(log) as f:
        out["order"] = [int(line) for line in f]

    # ProcessGroupMesh(n, 1) and (1, n): groups along each axis and both.
    mesh = ProcessGroupMesh(1, n)
    out["coord"] = (mesh.coordinate(), mesh.coordinate(1), mesh.size(), mesh.size(0), mesh.rank)
    row = mesh.get_group_along_axis(1)
    col = mesh.get_group_along_axis(0)
    both = mesh.create_group_along_axis([0, 1])
    assert mesh.get_group_along_axis(1) is row  # cached
    out["ranks"] = [mesh.get_ranks_in_group(g) for g in (row, col, both)]
    t = torch.tensor([float(rank + 1)])
    comm.all_reduce(t, group=row)
    out["row_sum"] = t.item()
    out["sub_master"] = (coordinator.is_master(row), coordinator.is_master(col))
    out["sub_last"] = coordinator.is_last_process(row)
    coordinator.block_all(row)
    # indices_at_axis: a group of the first two ranks along axis 1 (same on every rank).
    first_two = mesh.get_group_along_axis(1, indices_at_axis=[0, 1])
    out["first_two"] = mesh.get_ranks_in_group(first_two) if first_two is not None else None
    try:
        ProcessGroupMesh(2, n)
    except ValueError as e:
        out["bad_shape"] = str(e)
    manager = ProcessGroupManager()
    pair = manager.create_process_group("pair", [0, 1])
    out["manager"] = (pair.ranks if pair is not None else None, manager.get("pair") is pair)
    manager.destroy("pair")
    mesh.destroy_mesh_process_groups()
    return out


@pytest.mark.parametrize("n", [2, 3])
def test_coordinator_and_mesh(n, tmp_path):
    results = run_distributed(coordinator_and_mesh, n, str(tmp_path), timeout=60)
    everyone = list(range(n))
    for rank, r in enumerate(results):
        assert r["who"] == (rank, n, rank)
        assert r["flags"] == (rank == 0, rank == 0, rank == n - 1)
        expected = "master says 0\nnode master says 0\n" if rank == 0 else ""
        assert r["printed"] == expected
        assert r["on_master_only"] == (9 if rank == 0 else None)
        assert r["order"][0] == n - 1 and sorted(r["order"]) == everyone
        assert r["coord"] == ((0, rank), rank, (1, n), 1, rank)
        assert r["ranks"] == [everyone, [rank], everyone]
        assert r["row_sum"] == n * (n + 1) / 2
        assert r["sub_master"] == (rank == 0, True) and r["sub_last"] == (rank == n - 1)
        assert r["first_two"] == ([0, 1] if rank < 2 else None)
        assert f"2 * {n} = {2 * n} != world size {n}" in r["bad_shape"]
        assert r["manager"] == ((0, 1) if rank < 2 else None, True)
