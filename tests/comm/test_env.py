"""megalith_comm's launcher environment: torchrun, SLURM, OpenMPI, explicit arguments.

Everything here is read and checked before any socket is opened, so these tests
need no processes.
"""

from __future__ import annotations

import pytest

from megalith_comm import LaunchConfig, expand_nodelist
from megalith_comm.bootstrap import timeout_from_env
from megalith_comm.launch_env import SLURM_PORT_BASE, SLURM_PORT_SPAN


def cfg(env, **overrides):
    return LaunchConfig.from_env(env, **overrides)


def test_torchrun():
    c = cfg(
        {
            "RANK": "3",
            "WORLD_SIZE": "4",
            "LOCAL_RANK": "1",
            "MASTER_ADDR": "10.0.0.2",
            "MASTER_PORT": "29400",
        }
    )
    assert (c.rank, c.world_size, c.local_rank) == (3, 4, 1)
    assert (c.master_addr, c.master_port, c.source) == ("10.0.0.2", 29400, "torchrun")


def test_slurm_master_is_first_node_and_port_from_job_id():
    env = {
        "SLURM_PROCID": "5",
        "SLURM_NTASKS": "8",
        "SLURM_LOCALID": "1",
        "SLURM_JOB_NODELIST": "gpu[007-008,010],cpu1",
        "SLURM_JOB_ID": "123456",
        "SLURM_LAUNCH_NODE_IPADDR": "10.9.9.9",
    }
    c = cfg(env)
    assert (c.rank, c.world_size, c.local_rank, c.source) == (5, 8, 1, "SLURM")
    assert c.master_addr == "gpu007"
    assert c.master_port == SLURM_PORT_BASE + 123456 % SLURM_PORT_SPAN
    # MASTER_ADDR / MASTER_PORT win; the launch node is the last resort.
    c = cfg({**env, "MASTER_ADDR": "head", "MASTER_PORT": "4000"})
    assert (c.master_addr, c.master_port) == ("head", 4000)
    del env["SLURM_JOB_NODELIST"]
    assert cfg(env).master_addr == "10.9.9.9"


def test_openmpi():
    env = {
        "OMPI_COMM_WORLD_RANK": "1",
        "OMPI_COMM_WORLD_SIZE": "2",
        "OMPI_COMM_WORLD_LOCAL_RANK": "1",
        "MASTER_ADDR": "node0",
    }
    c = cfg(env)
    assert (c.rank, c.world_size, c.local_rank, c.master_addr, c.master_port, c.source) == (
        1,
        2,
        1,
        "node0",
        29500,
        "OpenMPI",
    )
    del env["MASTER_ADDR"]
    with pytest.raises(ValueError, match="OpenMPI: MASTER_ADDR is not set"):
        cfg(env)


def test_no_launcher_is_one_process_and_arguments_override():
    c = cfg({})
    assert (c.rank, c.world_size, c.master_addr) == (0, 1, "127.0.0.1")
    c = cfg(
        {"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "a", "MASTER_PORT": "1"},
        rank=1,
        master_port=2345,
    )
    assert (c.rank, c.world_size, c.master_port) == (1, 2, 2345)


@pytest.mark.parametrize(
    ("env", "message"),
    [
        (
            {"RANK": "4", "WORLD_SIZE": "4", "MASTER_ADDR": "h"},
            r"RANK=4 is outside \[0, WORLD_SIZE=4\)",
        ),
        ({"RANK": "-1", "WORLD_SIZE": "4", "MASTER_ADDR": "h"}, r"RANK=-1 is outside"),
        ({"RANK": "0", "WORLD_SIZE": "0"}, r"WORLD_SIZE=0: the world size must be at least 1"),
        ({"RANK": "x", "WORLD_SIZE": "2", "MASTER_ADDR": "h"}, r"RANK='x' is not an integer"),
        (
            {"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "h", "MASTER_PORT": "70000"},
            r"MASTER_PORT=70000 is not a TCP port in \[1, 65535\]",
        ),
        (
            {"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "h", "MASTER_PORT": "0"},
            r"0, any free port, works only for world size 1",
        ),
        ({"RANK": "1", "WORLD_SIZE": "2"}, r"MASTER_ADDR is not"),
        (
            {"SLURM_PROCID": "2", "SLURM_NTASKS": "2", "SLURM_JOB_NODELIST": "n1"},
            r"SLURM_PROCID=2 is outside \[0, SLURM_NTASKS=2\)",
        ),
        (
            {
                "OMPI_COMM_WORLD_RANK": "0",
                "OMPI_COMM_WORLD_SIZE": "2",
                "MASTER_ADDR": "h",
                "OMPI_COMM_WORLD_LOCAL_RANK": "-2",
            },
            r"OMPI_COMM_WORLD_LOCAL_RANK=-2 must be >= 0",
        ),
    ],
)
def test_bad_values_name_the_variable(env, message):
    with pytest.raises(ValueError, match=message):
        cfg(env)


def test_bad_argument_names_the_argument():
    with pytest.raises(ValueError, match=r"rank=7 is outside \[0, world_size=2\)"):
        cfg({}, rank=7, world_size=2, master_port=1234)


@pytest.mark.parametrize(
    ("nodelist", "hosts"),
    [
        ("n1", ["n1"]),
        ("gpu[01-03,07]", ["gpu01", "gpu02", "gpu03", "gpu07"]),
        ("a[1-2],b,c[9-10]", ["a1", "a2", "b", "c9", "c10"]),
        ("r[1-2]n[1-2]-ib", ["r1n1-ib", "r1n2-ib", "r2n1-ib", "r2n2-ib"]),
        ("node[0098-0101]", ["node0098", "node0099", "node0100", "node0101"]),
    ],
)
def test_expand_nodelist(nodelist, hosts):
    assert expand_nodelist(nodelist) == hosts


@pytest.mark.parametrize("bad", ["gpu[1-2", "gpu]1", "gpu[a-b]", ""])
def test_expand_nodelist_rejects(bad):
    with pytest.raises(ValueError, match="SLURM node list"):
        expand_nodelist(bad)


def test_timeout(monkeypatch):
    monkeypatch.delenv("MEGALITH_COMM_TIMEOUT", raising=False)
    assert timeout_from_env() == 300.0
    monkeypatch.setenv("MEGALITH_COMM_TIMEOUT", "12.5")
    assert timeout_from_env() == 12.5
    assert timeout_from_env(3) == 3.0
    monkeypatch.setenv("MEGALITH_COMM_TIMEOUT", "soon")
    with pytest.raises(ValueError, match="MEGALITH_COMM_TIMEOUT='soon' is not a number"):
        timeout_from_env()
    monkeypatch.setenv("MEGALITH_COMM_TIMEOUT", "-1")
    with pytest.raises(
        ValueError, match=r"MEGALITH_COMM_TIMEOUT=-1\.0: the timeout must be a positive"
    ):
        timeout_from_env()
