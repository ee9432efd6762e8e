"""Where this rank is: rank, world size and master address from the launcher's environment.

`LaunchConfig.from_env()` reads, in this order, the first launcher that set its
variables: torchrun (and `megalith run`), SLURM's srun, OpenMPI's mpirun. With none
of them it is a single process (world size 1). Explicit arguments override what
the environment says. Every value is checked here, before any socket is opened,
and an error names the variable it came from and its value.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

# Default rendezvous port when a launcher gives none (torch.distributed's default).
DEFAULT_PORT = 29500
# SLURM jobs without MASTER_PORT get 12000 + job id % 20000: below Linux's ephemeral
# range (32768+), and the same on every node of the job without talking.
SLURM_PORT_BASE = 12000
SLURM_PORT_SPAN = 20000


@dataclass(frozen=True)
class LaunchConfig:
    """One rank's place in the job. Validates itself on construction.

    `names` maps each field to where its value came from (an environment
    variable such as "SLURM_PROCID", or "argument"), so that errors point at the
    setting to fix.
    """

    rank: int
    world_size: int
    local_rank: int
    master_addr: str
    master_port: int
    source: str = "argument"
    names: Mapping[str, str] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        n = {k: self.names.get(k, k) for k in ("rank", "world_size", "local_rank", "master_port")}
        if self.world_size < 1:
            raise ValueError(
                f"{n['world_size']}={self.world_size}: the world size must be at least 1 "
                f"(launcher: {self.source})"
            )
        if not 0 <= self.rank < self.world_size:
            raise ValueError(
                f"{n['rank']}={self.rank} is outside [0, {n['world_size']}={self.world_size}): "
                f"each rank must be in 0..world_size-1 (launcher: {self.source})"
            )
        if self.local_rank < 0:
            raise ValueError(f"{n['local_rank']}={self.local_rank} must be >= 0")
        # Port 0 (any free port) only works when nobody else has to find it.
        low = 0 if self.world_size == 1 else 1
        if not low <= self.master_port <= 65535:
            raise ValueError(
                f"{n['master_port']}={self.master_port} is not a TCP port in [{low}, 65535]"
                + (
                    " (0, any free port, works only for world size 1)"
                    if self.master_port == 0
                    else ""
                )
            )
        if not self.master_addr:
            raise ValueError(f"{self.names.get('master_addr', 'master_addr')} is empty")

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: object) -> LaunchConfig:
        """Reads the launcher's variables from env (default os.environ); overrides win."""
        env = os.environ if env is None else env
        if "RANK" in env and "WORLD_SIZE" in env:
            found = _torchrun(env)
        elif "SLURM_PROCID" in env and "SLURM_NTASKS" in env:
            found = _slurm(env)
        elif "OMPI_COMM_WORLD_RANK" in env and "OMPI_COMM_WORLD_SIZE" in env:
            found = _openmpi(env)
        else:
            found = {
                "source": "none (single process)",
                "rank": (0, "rank"),
                "world_size": (1, "world_size"),
                "local_rank": (0, "local_rank"),
                "master_addr": (env.get("MASTER_ADDR", "127.0.0.1"), "MASTER_ADDR"),
                "master_port": (_int(env, "MASTER_PORT", 0), "MASTER_PORT"),
            }
        source = found.pop("source")
        values = {k: v for k, (v, _) in found.items()}
        names = {k: name for k, (_, name) in found.items()}
        for key, value in overrides.items():
            if value is not None:
                values[key] = value
                names[key] = key
        return cls(source=source, names=names, **values)  # type: ignore[arg-type]


def _int(env: Mapping[str, str], name: str, default: int | None = None) -> int:
    raw = env.get(name)
    if raw is None:
        if default is None:
            raise ValueError(f"{name} is not set")
        return default
    try:
        return int(raw.strip())
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not an integer") from None


def _torchrun(env: Mapping[str, str]) -> dict:
    if "MASTER_ADDR" not in env and _int(env, "WORLD_SIZE") > 1:
        raise ValueError("RANK and WORLD_SIZE are set but MASTER_ADDR is not: set MASTER_ADDR")
    return {
        "source": "torchrun",
        "rank": (_int(env, "RANK"), "RANK"),
        "world_size": (_int(env, "WORLD_SIZE"), "WORLD_SIZE"),
        "local_rank": (_int(env, "LOCAL_RANK", 0), "LOCAL_RANK"),
        "master_addr": (env.get("MASTER_ADDR", "127.0.0.1"), "MASTER_ADDR"),
        "master_port": (_int(env, "MASTER_PORT", DEFAULT_PORT), "MASTER_PORT"),
    }


def _slurm(env: Mapping[str, str]) -> dict:
    # The master is where rank 0 runs: the first node of the step (or job). We prefer
    # it to SLURM_LAUNCH_NODE_IPADDR, which is the host srun ran on: the same node
    # under sbatch, but a login node (with no rank on it) for an interactive srun.
    if "MASTER_ADDR" in env:
        addr, addr_name = env["MASTER_ADDR"], "MASTER_ADDR"
    else:
        nodelist_var = next(
            (
                v
                for v in ("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST")
                if v in env
            ),
            None,
        )
        if nodelist_var:
            addr, addr_name = expand_nodelist(env[nodelist_var])[0], nodelist_var
        elif "SLURM_LAUNCH_NODE_IPADDR" in env:
            addr, addr_name = env["SLURM_LAUNCH_NODE_IPADDR"], "SLURM_LAUNCH_NODE_IPADDR"
        else:
            raise ValueError(
                "SLURM: no master address: set MASTER_ADDR, or run inside a job "
                "(SLURM_JOB_NODELIST is not set)"
            )
    if "MASTER_PORT" in env:
        port, port_name = _int(env, "MASTER_PORT"), "MASTER_PORT"
    elif "SLURM_JOB_ID" in env:
        job = _int(env, "SLURM_JOB_ID")
        port, port_name = SLURM_PORT_BASE + job % SLURM_PORT_SPAN, "port from SLURM_JOB_ID"
    else:
        port, port_name = DEFAULT_PORT, "default port"
    return {
        "source": "SLURM",
        "rank": (_int(env, "SLURM_PROCID"), "SLURM_PROCID"),
        "world_size": (_int(env, "SLURM_NTASKS"), "SLURM_NTASKS"),
        "local_rank": (_int(env, "SLURM_LOCALID", 0), "SLURM_LOCALID"),
        "master_addr": (addr, addr_name),
        "master_port": (port, port_name),
    }


def _openmpi(env: Mapping[str, str]) -> dict:
    size = _int(env, "OMPI_COMM_WORLD_SIZE")
    if "MASTER_ADDR" not in env and size > 1:
        raise ValueError(
            "OpenMPI: MASTER_ADDR is not set; pass it to every rank "
            "(mpirun -x MASTER_ADDR=<host of rank 0> -x MASTER_PORT=<port>)"
        )
    return {
        "source": "OpenMPI",
        "rank": (_int(env, "OMPI_COMM_WORLD_RANK"), "OMPI_COMM_WORLD_RANK"),
        "world_size": (size, "OMPI_COMM_WORLD_SIZE"),
        "local_rank": (_int(env, "OMPI_COMM_WORLD_LOCAL_RANK", 0), "OMPI_COMM_WORLD_LOCAL_RANK"),
        "master_addr": (env.get("MASTER_ADDR", "127.0.0.1"), "MASTER_ADDR"),
        "master_port": (_int(env, "MASTER_PORT", DEFAULT_PORT), "MASTER_PORT"),
    }


_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")


def expand_nodelist(nodelist: str) -> list[str]:
    """Expands SLURM's compressed host list: "gpu[01-03,07],cpu1" -> gpu01..gpu03, gpu07, cpu1.

    Several bracket groups in one name ("r[1-2]n[1-2]") expand to their product;
    zero padding is kept.
    """
    hosts: list[str] = []
    for item in _split_top_level(nodelist.strip()):
        hosts.extend(_expand_one(item))
    if not hosts:
        raise ValueError(f"SLURM node list {nodelist!r} names no host")
    return hosts


def _split_top_level(text: str) -> list[str]:
    items, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise ValueError(f"SLURM node list {text!r}: unbalanced ']'")
        elif ch == "," and depth == 0:
            items.append(text[start:i])
            start = i + 1
    if depth:
        raise ValueError(f"SLURM node list {text!r}: unbalanced '['")
    items.append(text[start:])
    return [item for item in items if item]


def _expand_one(item: str) -> list[str]:
    open_at = item.find("[")
    if open_at < 0:
        return [item]
    close_at = item.index("]", open_at)
    prefix, body, rest = item[:open_at], item[open_at + 1 : close_at], item[close_at + 1 :]
    tails = _expand_one(rest)
    out = []
    for part in body.split(","):
        match = _RANGE.match(part.strip())
        if not match:
            raise ValueError(f"SLURM node list entry {item!r}: cannot read range {part!r}")
        lo, hi = match.group(1), match.group(2) or match.group(1)
        width = len(lo) if lo.startswith("0") else 0
        for number in range(int(lo), int(hi) + 1):
            out.extend(f"{prefix}{number:0{width}d}{tail}" for tail in tails)
    return out
