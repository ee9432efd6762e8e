"""ColossalAI's entry points on megalith: launch, launch_from_torch/slurm/openmpi,
get_default_parser (docs/source/en/basics/launch_colossalai.md's uses), on CPU ranks."""

from __future__ import annotations

import io
import logging
import os
import random
import subprocess
import sys
import warnings

import numpy as np
import pytest
import torch

import megalith
import megalith_comm as comm
from megalith.testing import free_port, run_distributed

_LAUNCH_VARS = (
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
)


def _seeded(seed: int) -> tuple[float, float, list[float]]:
    return random.random(), float(np.random.rand()), torch.rand(3).tolist()


def _expected(seed: int) -> tuple[float, float, list[float]]:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    return _seeded(seed)


def _state(rank: int) -> dict:
    """Where this rank stands after a launch: the world, a collective, the seeds."""
    world = comm.get_world()
    t = torch.tensor([float(rank + 1)])
    comm.all_reduce(t)
    return {
        "rank": world.rank,
        "world_size": world.world_size,
        "local_rank": world.local_rank,
        "port": world.master_port,
        "sum": t.item(),
    }


def launches(rank: int, ports: list[int]) -> dict:
    """One rank going through every launcher in turn, as each would set the environment."""
    torchrun = {k: os.environ[k] for k in _LAUNCH_VARS}
    log = io.StringIO()
    handler = logging.StreamHandler(log)
    logging.getLogger("megalith").addHandler(handler)
    out = {}

    def leave() -> None:
        comm.destroy()
        for k in _LAUNCH_VARS:
            os.environ.pop(k, None)

    # srun: SLURM_PROCID / SLURM_NPROCS / SLURM_LOCALID, host and port from the command line.
    leave()
    os.environ.update(SLURM_PROCID=str(rank), SLURM_NPROCS="2", SLURM_LOCALID=str(rank))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        megalith.launch_from_slurm(host="127.0.0.1", port=ports[0], seed=7)
    out["slurm_seeds"] = _seeded(7)
    out["slurm"] = _state(rank)
    out["nccl_warning"] = [str(w.message) for w in caught]
    for k in ("SLURM_PROCID", "SLURM_NPROCS", "SLURM_LOCALID"):
        del os.environ[k]

    # mpirun: OMPI_COMM_WORLD_*; no MASTER_ADDR exported (host is an argument).
    leave()
    os.environ.update(
        OMPI_COMM_WORLD_RANK=str(rank),
        OMPI_COMM_WORLD_SIZE="2",
        OMPI_COMM_WORLD_LOCAL_RANK="0",  # two nodes of one rank each
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        megalith.launch_from_openmpi(host="127.0.0.1", port=ports[1], seed=11, verbose=False)
    out["openmpi_seeds"] = _seeded(11)
    out["openmpi"] = _state(rank)
    out["second_warning"] = [str(w.message) for w in caught]  # the nccl fallback warns once
    for k in ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"):
        del os.environ[k]

    # The doc's native launch, arguments from get_default_parser.
    leave()
    args = megalith.get_default_parser().parse_args(
        ["--host", "127.0.0.1", "--port", str(ports[2]), "--rank", str(rank), "--world_size", "2"]
    )
    megalith.launch(
        rank=args.rank,
        world_size=args.world_size,
        host=args.host,
        port=args.port,
        backend="gloo",
        seed=3,
    )
    out["native_seeds"] = _seeded(3)
    out["native"] = _state(rank)
    out["again"] = megalith.launch(rank, 2, "127.0.0.1", ports[2], backend="gloo") is None

    # plain `python train.py`: launch_from_torch with no launcher is one process.
    leave()
    megalith.launch_from_torch(seed=5)
    out["alone"] = _state(rank)

    # torchrun: the environment the test harness started this rank with.
    comm.destroy()
    os.environ.update(torchrun)
    megalith.launch_from_torch(backend="gloo", seed=9)
    out["torch_seeds"] = _seeded(9)
    out["torch"] = _state(rank)
    logging.getLogger("megalith").removeHandler(handler)
    out["log"] = log.getvalue()
    return out


def test_every_launcher_on_two_cpu_ranks():
    ports: list[int] = []
    while len(ports) < 3:
        p = free_port()
        if p not in ports:
            ports.append(p)
    results = run_distributed(launches, 2, ports, timeout=90)
    for rank, r in enumerate(results):
        assert r["slurm"] == {
            "rank": rank,
            "world_size": 2,
            "local_rank": rank,
            "port": ports[0],
            "sum": 3.0,
        }
        assert r["openmpi"] == {
            "rank": rank,
            "world_size": 2,
            "local_rank": 0,
            "port": ports[1],
            "sum": 3.0,
        }
        assert r["native"] == {
            "rank": rank,
            "world_size": 2,
            "local_rank": rank,
            "port": ports[2],
            "sum": 3.0,
        }
        assert r["alone"] == {
            "rank": 0,
            "world_size": 1,
            "local_rank": 0,
            "port": 0,
            "sum": float(rank + 1),
        }
        assert r["torch"]["rank"] == rank and r["torch"]["world_size"] == 2
        assert r["torch"]["sum"] == 3.0 and r["again"]
        # Every rank gets the same seed (ColossalAI's set_seed: random, numpy and torch).
        for name, seed in (("slurm", 7), ("openmpi", 11), ("native", 3), ("torch", 9)):
            assert r[f"{name}_seeds"] == _expected(seed)
        # backend="nccl" (the default) without CUDA: Gloo, with one warning per process.
        assert len(r["nccl_warning"]) == 1 and "Gloo" in r["nccl_warning"][0]
        assert r["second_warning"] == []
    # verbose=True logs the world size on rank 0 only (ranks=[0]).
    line = "Distributed environment is initialized, world size: 2"
    # slurm, native (twice) and torchrun; openmpi had verbose=False
    assert results[0]["log"].count(line) == 4
    assert line not in results[1]["log"]
    # Alone, each process is rank 0 of its own world of one.
    assert all("world size: 1" in r["log"] for r in results)


def test_get_default_parser_has_colossalais_options():
    parser = megalith.get_default_parser()
    parser.add_argument("--epochs", type=int, default=2)  # a user's own option
    args = parser.parse_args(
        "--config c.py --host h1 --port 29505 --world_size 4 --rank 3 --local_rank 1".split()
    )
    assert vars(args) == {
        "config": "c.py",
        "host": "h1",
        "port": 29505,
        "world_size": 4,
        "rank": 3,
        "local_rank": 1,
        "backend": "nccl",
        "epochs": 2,
    }
    assert parser.parse_args([]).host is None


@pytest.mark.parametrize(
    "kwargs, words",
    [
        ({"rank": 2, "world_size": 2}, ["rank=2", "world_size=2"]),
        ({"rank": 0, "world_size": 0}, ["world_size=0", "at least 1"]),
        ({"rank": -1, "world_size": 2}, ["rank=-1"]),
        ({"rank": "one", "world_size": 2}, ["rank='one'", "int"]),
        ({"rank": 0, "world_size": 2, "port": 70000}, ["70000", "TCP port"]),
        ({"rank": 0, "world_size": 2, "host": None}, ["host is None", "--host"]),
        ({"rank": 0, "world_size": 2, "local_rank": -1}, ["local_rank=-1"]),
    ],
)
def test_bad_launch_arguments_fail_before_any_socket(kwargs, words):
    args = {"host": "127.0.0.1", "port": 29500, **kwargs}
    with pytest.raises(ValueError) as err:
        megalith.launch(**args)
    for word in words:
        assert word in str(err.value)
    assert not comm.is_initialized()


@pytest.mark.parametrize(
    "launcher, variable, tool",
    [
        ("launch_from_slurm", "SLURM_PROCID", "srun"),
        ("launch_from_openmpi", "OMPI_COMM_WORLD_RANK", "mpirun"),
    ],
)
def test_launcher_without_its_environment_names_it(monkeypatch, launcher, variable, tool):
    for name in list(os.environ):
        if name.startswith(("SLURM_", "OMPI_")):
            monkeypatch.delenv(name)
    with pytest.raises(RuntimeError) as err:
        getattr(megalith, launcher)(host="127.0.0.1", port=29500)
    assert variable in str(err.value) and tool in str(err.value)
    assert not comm.is_initialized()


def test_torchrun_environment_without_master_addr(monkeypatch):
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.delenv("MASTER_ADDR", raising=False)
    with pytest.raises(RuntimeError, match="MASTER_ADDR"):
        megalith.launch_from_torch()


def test_names_are_reexported_and_import_stays_cheap():
    from megalith import initialize

    for name in ("launch", "launch_from_torch", "launch_from_slurm", "launch_from_openmpi"):
        assert getattr(megalith, name) is getattr(initialize, name)
        assert name in megalith.__all__ and name in dir(megalith)
    from megalith.booster import launch_from_torch  # the Booster's old place still imports

    assert callable(launch_from_torch)
    code = (
        "import sys, megalith; megalith.launch; megalith.get_default_parser().parse_args([]); "
        "assert 'torch' not in sys.modules, 'import megalith loaded torch'"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
