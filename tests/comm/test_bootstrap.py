"""megalith_comm.init/destroy in this process (world size 1), the store's binding, and the
lazy NCCL communicator's unique-id exchange (with a stand-in engine: no GPU needed)."""

from __future__ import annotations

import socket
import types
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

import megalith_comm as comm
from megalith.testing import free_port, run_distributed
from megalith_comm import bootstrap, nccl
from megalith_comm import store as store_module
from megalith_comm.backends import NcclOps
from megalith_comm.launch_env import LaunchConfig

LAUNCH_VARS = (
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
    "SLURM_PROCID",
    "SLURM_NTASKS",
    "OMPI_COMM_WORLD_RANK",
    "OMPI_COMM_WORLD_SIZE",
)


@pytest.fixture
def clean_env(monkeypatch):
    for name in LAUNCH_VARS:
        monkeypatch.delenv(name, raising=False)
    yield monkeypatch
    comm.destroy()


def test_single_process_init_is_idempotent(clean_env):
    world = comm.init(device="cpu")
    assert (world.rank, world.world_size, world.device) == (0, 1, torch.device("cpu"))
    assert comm.init() is world and comm.get_world() is world
    with pytest.raises(ValueError, match=r"cannot change world_size=2 \(initialized with 1\)"):
        comm.init(world_size=2)
    t = torch.arange(3.0)
    comm.all_reduce(t, op="avg")  # a world of one: the identity
    out = torch.empty(3)
    comm.reduce_scatter(out, t)
    assert t.tolist() == out.tolist() == [0.0, 1.0, 2.0]
    comm.destroy()
    assert not dist.is_initialized()
    with pytest.raises(RuntimeError, match=r"call megalith_comm\.init"):
        comm.get_world()


def test_bad_environment_fails_before_any_socket(clean_env):
    def no_rendezvous(*args, **kwargs):
        raise AssertionError("init opened the rendezvous before validating")

    clean_env.setattr(bootstrap, "rendezvous", no_rendezvous)
    clean_env.setenv("RANK", "2")
    clean_env.setenv("WORLD_SIZE", "2")
    clean_env.setenv("MASTER_ADDR", "127.0.0.1")
    with pytest.raises(ValueError, match=r"RANK=2 is outside \[0, WORLD_SIZE=2\)"):
        comm.init()
    clean_env.setenv("RANK", "0")
    clean_env.setenv("MEGALITH_COMM_TIMEOUT", "0")
    with pytest.raises(ValueError, match=r"MEGALITH_COMM_TIMEOUT=0\.0"):
        comm.init()


def _listening(port: int) -> list[str]:
    """Local addresses of the sockets listening on port, from /proc/net/tcp{,6}."""
    found = []
    for name in ("tcp", "tcp6"):
        path = Path("/proc/net") / name
        if not path.exists():
            continue
        for line in path.read_text().splitlines()[1:]:
            fields = line.split()
            addr, hexport = fields[1].rsplit(":", 1)
            if int(hexport, 16) == port and fields[3] == "0A":  # 0A: LISTEN
                found.append(addr)
    return found


@pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="needs /proc/net/tcp")
def test_store_listens_on_master_addr_only():
    port = free_port()
    cfg = LaunchConfig(
        rank=0, world_size=2, local_rank=0, master_addr="127.0.0.1", master_port=port
    )
    store, spec = store_module.open_store(cfg, 5.0)
    assert spec.host_rank == 0 and spec.prefix is None
    try:
        assert _listening(port) == ["0100007F"], _listening(port)  # 127.0.0.1, not 0.0.0.0 / ::
        store.set("k", "v")
        client = dist.TCPStore("127.0.0.1", port, None, False)
        assert client.get("k") == b"v"
    finally:
        del store


def test_port_in_use_is_named():
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        cfg = LaunchConfig(0, 2, 0, "127.0.0.1", port)
        with pytest.raises(comm.CommError, match=rf"cannot listen on .* = 127.0.0.1:{port}"):
            store_module.open_store(cfg, 5.0)


class FakeCommunicator:
    def __init__(self, unique_id, world_size, rank, device, timeout_s, name):
        self.args = (unique_id, world_size, rank, device, timeout_s, name)
        self.calls = []

    def __getattr__(self, op):
        def record(*args, **kwargs):
            self.calls.append((op, args, kwargs))
            return types.SimpleNamespace(wait=lambda stream=0: None, is_completed=lambda: True)

        return record


class FakeEngine:
    NcclCommunicator = FakeCommunicator

    @staticmethod
    def nccl_unique_id():
        import os

        return os.urandom(128)


def nccl_exchange(rank: int) -> list:
    nccl.engine = lambda: FakeEngine  # this rank process only
    world = comm.get_world()
    mesh = comm.Mesh(None, dp=2)
    out = []
    for group in (world.group, mesh.group("dp")):
        c = group.nccl(torch.device("cuda", rank))
        assert group.nccl(torch.device("cuda", rank)) is c  # created once
        with pytest.raises(ValueError, match="one CUDA device per rank"):
            group.nccl(torch.device("cuda", 5))
        out.append(c.args)
    return out


@pytest.mark.timeout(60)
def test_nccl_unique_id_goes_through_the_store():
    results = run_distributed(nccl_exchange, 2, timeout=50)
    for g in range(2):
        (uid0, ws0, r0, dev0, t0, name0), (uid1, ws1, r1, dev1, _, name1) = (
            results[0][g],
            results[1][g],
        )
        assert uid0 == uid1 and len(uid0) == 128
        assert (ws0, r0, dev0, ws1, r1, dev1) == (2, 0, 0, 2, 1, 1)
        assert name0 == name1 and t0 > 0
    assert results[0][0][0] != results[0][1][0], "each group has its own unique id"
    assert [results[0][0][5], results[0][1][5]] == ["world", "mesh/dp"]


def test_nccl_ops_pass_element_counts_and_the_current_stream(monkeypatch):
    ops = NcclOps.__new__(NcclOps)
    ops.comm, ops.device = FakeCommunicator(b"", 3, 0, 0, 1.0, "g"), torch.device("cpu")
    monkeypatch.setattr(NcclOps, "_stream", lambda self: 1234)
    send, recv = torch.zeros(6, 4), torch.zeros(5, 4)
    ops.all_to_all(recv, send, [1, 2, 2], [3, 0, 3])
    ops.reduce_scatter(recv, send, "avg")
    op, args, kwargs = ops.comm.calls[0]
    assert op == "all_to_allv" and args[1] == [12, 0, 12] and args[3] == [4, 8, 8]
    assert kwargs == {"stream": 1234}
    op, args, kwargs = ops.comm.calls[1]
    assert op == "reduce_scatter" and args[0] is send and args[1] is recv
    assert kwargs == {"op": "avg", "stream": 1234}


def test_nccl_wheel_lib_dir(monkeypatch, tmp_path):
    spec = types.SimpleNamespace(submodule_search_locations=[str(tmp_path / "nvidia")])
    monkeypatch.setattr(nccl.importlib.util, "find_spec", lambda name: spec)
    assert nccl.nccl_wheel_lib_dir() is None
    for sub in ("cu13/lib", "nccl/lib"):
        (tmp_path / "nvidia" / sub).mkdir(parents=True)
    (tmp_path / "nvidia" / "cu13/lib/libnccl.so.2").touch()
    assert nccl.nccl_wheel_lib_dir() == str(tmp_path / "nvidia/cu13/lib")
    (tmp_path / "nvidia" / "nccl/lib/libnccl.so.2").touch()
    assert nccl.nccl_wheel_lib_dir() == str(tmp_path / "nvidia/nccl/lib")
