"""Static placement: which chunks keep their optimizer states on the device tier.

The first ceil(optim_frac * n) chunks are offloaded (ColossalAI's offload_optim_frac
counts chunks the same way); the rest stay on the device tier while their bytes
fit device_budget_bytes, and are offloaded past it. Offloaded chunks go to the
configured tier. The host side is then checked against host_budget_bytes before
anything is allocated, so a budget that cannot work fails with the numbers.

With placement="auto" every chunk starts offloaded (the warm-up step); what comes
back to the device afterwards is megalith_offload.auto's choice.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from .config import OffloadConfig


@dataclass(frozen=True)
class ChunkCost:
    """Bytes one chunk's training state needs on each tier.

    device: masters (when kept apart from the params) and states, if kept on the device.
    master: the fp32 master on the host, if offloaded.
    states: the optimizer states on the host, if offloaded to the host tier.
    swap: the chunk's swap file (and staging buffer), if offloaded to NVMe.
    """

    device: int
    master: int
    states: int
    swap: int


@dataclass(frozen=True)
class Plan:
    tiers: tuple[str, ...]  # "device", "host" or "nvme" per chunk
    slots: int  # NVMe staging buffers: 2 overlap reads with steps, 1 does not, 0: no NVMe
    slot_bytes: int
    device_bytes: int
    host_bytes: int
    nvme_bytes: int


def plan(costs: Sequence[ChunkCost], config: OffloadConfig) -> Plan:
    n = len(costs)
    n_off = min(n, math.ceil(config.optim_frac * n - 1e-9))
    tiers = [config.tier] * n_off + ["device"] * (n - n_off)
    budget = config.device_budget_bytes if config.placement == "static" else None
    on_device = 0
    for i in range(n_off, n):
        if budget is not None and on_device + costs[i].device > budget:
            tiers[i] = config.tier
        else:
            on_device += costs[i].device
    off = [c for c, t in zip(costs, tiers) if t != "device"]
    masters = sum(c.master for c in off)
    slots, slot_bytes, nvme = 0, 0, 0
    if config.tier == "host":
        host = masters + sum(c.states for c in off)
    else:
        slot_bytes = max((c.swap for c in off), default=0)
        nvme = sum(c.swap for c in off)
        slots = 2 if off else 0
        host = masters + slots * slot_bytes
    _check_host(config, off, masters, slot_bytes, host)
    if config.tier == "nvme" and config.host_budget_bytes is not None and off:
        if host > config.host_budget_bytes:
            slots, host = 1, masters + slot_bytes  # fits one staging buffer: no overlap
    return Plan(tuple(tiers), slots, slot_bytes, on_device, host, nvme)


def _check_host(
    config: OffloadConfig, off: list[ChunkCost], masters: int, slot_bytes: int, host: int
) -> None:
    limit = config.host_budget_bytes
    if limit is None or not off:
        return
    if config.tier == "host":
        one = min(c.master + c.states for c in off)
        if limit < one:
            raise ValueError(
                f"OffloadConfig: host_budget_bytes={limit} is too small for even one chunk: "
                f"its fp32 master and optimizer states take {one} bytes; raise it, or "
                "use tier='nvme'"
            )
        if host > limit:
            raise ValueError(
                f"OffloadConfig: host_budget_bytes={limit}, but the {len(off)} offloaded chunks "
                f"need {host} bytes of host memory (masters and optimizer states); raise it, "
                "lower optim_frac, raise device_budget_bytes, or use tier='nvme'"
            )
    elif limit < masters + slot_bytes:
        raise ValueError(
            f"OffloadConfig: host_budget_bytes={limit} is too small: the offloaded chunks' fp32 "
            f"masters take {masters} bytes and one NVMe staging buffer (the largest chunk's "
            f"optimizer states) {slot_bytes} bytes, {masters + slot_bytes} in all; raise it"
        )
