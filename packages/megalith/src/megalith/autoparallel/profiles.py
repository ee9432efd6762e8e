"""Machine profiles and cluster files: the built-in ones, JSON files, and collectives
scaled to group sizes that were not measured.

    profile = load_profile("h200")                 # built-in: "h200", "ci_cpu"
    profile = load_profile("~/.cache/megalith/profile-myhost.json")   # megalith calibrate
    cluster = load_cluster("cluster.json")         # nodes x GPUs of a profile

A cluster file:

    {"profile": "h200", "nodes": 64, "gpus_per_node": 8,
     "inter_node": {"latency_s": 1e-05, "bandwidth": 4e11},
     "device_memory_bytes": 141e9, "host_memory_bytes": 2e12}    # last two optional

"profile" is a built-in name or a path (relative to the cluster file's folder).

Scaling (`scaled`): a ring collective over g ranks sends each rank's share of the buffer
over g - 1 hops per phase; an all-reduce is a reduce-scatter then an all-gather. So with
B the buffer's bytes and L the per-link rate, time = a + f(g) * B / L, where
f(g) = 2 (g - 1) / g for all_reduce and (g - 1) / g for reduce_scatter and all_gather
(nccl-tests' busbw = algbw * f(g) is L). From the largest measured group g0 with
bandwidth (algbw) b0: L = b0 * f(g0), and at g the bandwidth is L / f(g); the latency
grows with the ring's steps, a(g) = a0 * (g - 1) / (g0 - 1). broadcast and send_recv
keep the measured figures (a pipelined broadcast's rate does not depend on g).
"""

from __future__ import annotations

import dataclasses
import json
import socket
from pathlib import Path
from typing import Any

from .types import AlphaBeta, Cluster, MachineProfile

BUILTIN_DIR = Path(__file__).with_name("profiles")
RING_FACTOR = {"all_reduce": 2.0, "reduce_scatter": 1.0, "all_gather": 1.0, "all_to_all": 1.0}


def builtin_profiles() -> list[str]:
    return sorted(p.stem for p in BUILTIN_DIR.glob("*.json"))


def default_profile_path() -> Path:
    """Where `megalith calibrate` writes by default."""
    return Path.home() / ".cache" / "megalith" / f"profile-{socket.gethostname()}.json"


def load_profile(name_or_path: str | Path) -> MachineProfile:
    """A built-in profile by name, or a profile JSON written by `megalith calibrate`."""
    if str(name_or_path) in builtin_profiles():
        return MachineProfile.load(BUILTIN_DIR / f"{name_or_path}.json")
    path = Path(name_or_path).expanduser()
    if not path.is_file():
        raise ValueError(
            f"no machine profile {str(name_or_path)!r}: not a built-in "
            f"({', '.join(builtin_profiles())}) and no such file; write one for this machine "
            "with `megalith calibrate --out FILE`"
        )
    try:
        return MachineProfile.load(path)
    except (KeyError, TypeError, json.JSONDecodeError) as err:
        raise ValueError(
            f"{path} is not a machine profile ({type(err).__name__}: {err}); "
            "write one with `megalith calibrate --out FILE`"
        ) from None


def ring_factor(op: str, size: int) -> float:
    """f(g): the multiple of the buffer that crosses each rank's link."""
    return RING_FACTOR[op] * (size - 1) / size


def scaled(profile: MachineProfile, op: str, size: int) -> AlphaBeta:
    """The AlphaBeta of `op` on `size` ranks of one node: measured if it was, else scaled
    from the largest measured group (the ring model in the module docstring)."""
    table = profile.collectives.get(op)
    if not table:
        raise ValueError(
            f"profile {profile.name!r} has no {op} figures (it has "
            f"{sorted(profile.collectives)}); recalibrate with `megalith calibrate`"
        )
    if str(size) in table:
        return table[str(size)]
    base = max(int(g) for g in table)
    measured = table[str(base)]
    if op not in RING_FACTOR or base < 2 or size < 2:
        return measured
    link = measured.bandwidth * ring_factor(op, base)
    return AlphaBeta(
        latency_s=measured.latency_s * (size - 1) / (base - 1),
        bandwidth=link / ring_factor(op, size),
    )


def with_group_sizes(profile: MachineProfile, sizes: list[int]) -> MachineProfile:
    """The profile with every collective given for each of `sizes` (scaled where not
    measured; measured figures are kept)."""
    table = {
        op: {**{str(g): scaled(profile, op, g) for g in sizes if g >= 2}, **measured}
        for op, measured in profile.collectives.items()
    }
    return dataclasses.replace(profile, collectives=table)


def _number(data: dict[str, Any], key: str, where: str) -> float:
    value = data.get(key)
    if not isinstance(value, (int, float)) or isinstance(value, bool) or value <= 0:
        raise ValueError(f"{where}: {key!r} must be a positive number, got {value!r}")
    return value


def load_cluster(path: str | Path) -> Cluster:
    """A Cluster from a cluster file (format in the module docstring); the profile's
    collectives are filled in for every group size up to gpus_per_node."""
    path = Path(path).expanduser()
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise ValueError(f"cannot read cluster file {path}: {err}") from None
    unknown = sorted(set(data) - {f.name for f in dataclasses.fields(Cluster)})
    if unknown:
        raise ValueError(
            f"{path}: unknown key(s) {unknown}; a cluster file has profile, nodes, "
            "gpus_per_node, inter_node, device_memory_bytes, host_memory_bytes"
        )
    if "profile" not in data:
        raise ValueError(f"{path}: 'profile' is missing (a built-in name or a profile path)")
    ref = str(data["profile"])
    relative = path.parent / ref
    profile = load_profile(
        relative if relative.is_file() and ref not in builtin_profiles() else ref
    )
    nodes = int(_number({"nodes": 1, **data}, "nodes", str(path)))
    per_node = int(
        _number({"gpus_per_node": profile.devices_per_node, **data}, "gpus_per_node", str(path))
    )
    inter = data.get("inter_node")
    if inter is not None:
        where = f"{path}: inter_node"
        inter = AlphaBeta(_number(inter, "latency_s", where), _number(inter, "bandwidth", where))
    elif nodes > 1:
        raise ValueError(
            f"{path}: {nodes} nodes need 'inter_node': {{'latency_s': ..., 'bandwidth': ...}} "
            "(the link between nodes, per node, each way, in s and bytes/s)"
        )
    memory = {
        key: int(_number(data, key, str(path)))
        for key in ("device_memory_bytes", "host_memory_bytes")
        if key in data
    }
    sizes = sorted({2**i for i in range(1, per_node.bit_length()) if 2**i <= per_node} | {per_node})
    return Cluster(
        profile=with_group_sizes(profile, sizes),
        nodes=nodes,
        gpus_per_node=per_node,
        inter_node=inter,
        **memory,
    )
