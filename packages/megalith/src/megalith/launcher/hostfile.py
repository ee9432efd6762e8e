"""Hosts, slots and the per-node plan of a multi-host `megalith run`.

A hostfile lists one host per line, DeepSpeed/ColossalAI style:

    # comment
    worker-0 slots=8
    worker-1 slots=8   # trailing comment
    worker-2           # no slots=: one process unless --nproc_per_node says more

Blank lines and comments are skipped. A host listed twice with the same slots
is kept once; listed with different slots it is an error naming both lines.

--include / --exclude take either of ColossalAI's two forms:
"h1,h2" (whole hosts) or "h1:0,1@h2" (NODE_SPEC@NODE_SPEC, NODE_SPEC =
host[:slot,slot...]). Naming slots pins the processes of that host to those
devices (CUDA_VISIBLE_DEVICES).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from pathlib import Path

NPROC_KEYWORDS = ("auto", "cpu", "gpu", "xpu")


class LaunchError(ValueError):
    """Bad launcher input, found before anything is started; the message names the fix."""


@dataclass(frozen=True)
class Host:
    name: str
    slots: tuple[int, ...] | None = None  # device indices; None: the hostfile did not say
    pinned: bool = False  # slots chosen by --include/--exclude: export CUDA_VISIBLE_DEVICES


@dataclass(frozen=True)
class NodePlan:
    host: str
    node_rank: int
    nproc: str  # a positive integer, or one of NPROC_KEYWORDS
    visible_devices: str | None = None  # CUDA_VISIBLE_DEVICES for this node, when pinned


_SLOTS = re.compile(r"^slots=(\d+)$")


def parse_hostfile_text(text: str, source: str = "hostfile") -> list[Host]:
    hosts: dict[str, tuple[Host, int]] = {}
    for lineno, raw in enumerate(text.splitlines(), 1):
        fields = raw.split("#", 1)[0].split()
        if not fields:
            continue
        name, rest = fields[0], fields[1:]
        slots = None
        if rest:
            match = _SLOTS.match(rest[0]) if len(rest) == 1 else None
            if match is None:
                raise LaunchError(
                    f"{source}:{lineno}: expected 'HOST' or 'HOST slots=N', got {raw.strip()!r}"
                )
            slots = tuple(range(int(match.group(1))))
            if not slots:
                raise LaunchError(f"{source}:{lineno}: {name} has slots=0; give it 1 or more")
        host = Host(name, slots)
        if name in hosts:
            first, first_line = hosts[name]
            if first != host:
                raise LaunchError(
                    f"{source}:{lineno}: {name} is listed again with different slots (line "
                    f"{first_line} has {_slots_text(first)}, this line {_slots_text(host)}); "
                    "keep one line per host"
                )
            continue
        hosts[name] = (host, lineno)
    if not hosts:
        raise LaunchError(f"{source} lists no hosts: add lines 'HOST slots=N'")
    return [host for host, _ in hosts.values()]


def parse_hostfile(path: str) -> list[Host]:
    file = Path(path)
    if not file.is_file():
        raise LaunchError(
            f"hostfile {path} not found: pass --hostfile FILE with lines 'HOST slots=N'"
        )
    return parse_hostfile_text(file.read_text(), source=str(path))


def parse_host_list(text: str) -> list[Host]:
    """--host h1,h2: hosts without slot counts."""
    names = [name.strip() for name in text.split(",") if name.strip()]
    if not names:
        raise LaunchError("--host is empty: pass --host h1,h2")
    return [Host(name) for name in dict.fromkeys(names)]


def parse_filter(text: str, option: str) -> dict[str, tuple[int, ...] | None]:
    """host -> slots named (None: the whole host), from either ColossalAI form."""
    if "@" in text or ":" in text:
        specs = [spec for spec in text.split("@") if spec.strip()]
    else:
        specs = [spec for spec in text.split(",") if spec.strip()]
    chosen: dict[str, tuple[int, ...] | None] = {}
    for spec in specs:
        name, _, slots = spec.strip().partition(":")
        try:
            ids = tuple(int(s) for s in slots.split(",")) if slots else None
        except ValueError:
            raise LaunchError(
                f"{option} {text!r}: slots of {name} must be integers, as in 'h1:0,1@h2'"
            ) from None
        chosen[name] = ids
    if not chosen:
        raise LaunchError(f"{option} is empty: pass 'h1,h2' or 'h1:0,1@h2'")
    return chosen


def filter_hosts(hosts: list[Host], include: str | None, exclude: str | None) -> list[Host]:
    if include and exclude:
        raise LaunchError("--include and --exclude are mutually exclusive: pass one of them")
    spec, option = (include, "--include") if include else (exclude, "--exclude")
    if not spec:
        return hosts
    chosen = parse_filter(spec, option)
    known = {host.name: host for host in hosts}
    for name, ids in chosen.items():
        if name not in known:
            raise LaunchError(f"{option}: unknown host {name!r}; the hosts are {', '.join(known)}")
        have = known[name].slots
        bad = [i for i in ids or () if have is not None and i not in have]
        if bad:
            raise LaunchError(
                f"{option}: {name} has no slot {bad[0]} (it has {_slots_text(known[name])})"
            )
    result = []
    for host in hosts:
        if host.name not in chosen:
            if exclude:
                result.append(host)
            continue
        ids = chosen[host.name]
        if include:
            result.append(host if ids is None else replace(host, slots=ids, pinned=True))
        elif ids is not None:  # exclude some slots of the host, keep the rest
            left = tuple(i for i in host.slots or () if i not in ids)
            if left:
                result.append(replace(host, slots=left, pinned=True))
    if not result:
        raise LaunchError(f"{option} {spec!r} leaves no hosts to run on")
    return result


def check_nproc(nproc: str | None) -> str | None:
    if nproc is None or nproc in NPROC_KEYWORDS:
        return nproc
    try:
        value = int(nproc)
    except ValueError:
        value = None
    if value is None or value <= 0:
        raise LaunchError(
            f"--nproc_per_node {nproc!r}: give a positive number of processes per node "
            f"(or one of {', '.join(NPROC_KEYWORDS)})"
        )
    return str(value)


def plan_nodes(
    hosts: list[Host], nproc: str | None, num_nodes: int | None = None
) -> list[NodePlan]:
    """One NodePlan per host, node 0 first. nproc: --nproc_per_node (None: the host's slots)."""
    nproc = check_nproc(nproc)
    if num_nodes is not None:
        if not 0 < num_nodes <= len(hosts):
            raise LaunchError(
                f"--nnodes/--num_nodes {num_nodes}: the host list has {len(hosts)} hosts "
                f"({', '.join(h.name for h in hosts)}); ask for 1 to {len(hosts)}"
            )
        hosts = hosts[:num_nodes]
    plans = []
    for rank, host in enumerate(hosts):
        count = nproc or str(len(host.slots) if host.slots else 1)
        if count.isdigit() and host.slots is not None and int(count) > len(host.slots):
            raise LaunchError(
                f"--nproc_per_node {count} exceeds the slots of {host.name} "
                f"({_slots_text(host)}): lower --nproc_per_node or raise slots= in the hostfile"
            )
        visible = None
        if host.pinned and host.slots is not None:
            used = host.slots[: int(count)] if count.isdigit() else host.slots
            visible = ",".join(map(str, used))
        plans.append(NodePlan(host.name, rank, count, visible))
    return plans


def _slots_text(host: Host) -> str:
    if host.slots is None:
        return "no slots="
    return f"slots {','.join(map(str, host.slots))}" if host.pinned else f"slots={len(host.slots)}"
