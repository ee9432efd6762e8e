"""Static placement: which chunks keep their optimizer states on the device tier.

The first ceil(optim_frac * n) chunks are offloaded (ColossalAI's offload_optim_frac
counts chunks the same way); the rest stay on the device tier while their bytes
fit device_budget_bytes, and are offloaded past it. Offloaded chunks go to the
configured tier; with tier="host+nvme" each offloaded chunk keeps its states in host
memory while host_budget_bytes has room for them (after every offloaded master and
the NVMe staging buffers), and on NVMe past it: the device, the host and the disk
together hold the model. The host side is then checked against host_budget_bytes
before anything is allocated, so a budget that cannot work fails with the numbers.

With placement="auto" every chunk starts offloaded (the warm-up step); what comes
back to the device afterwards is megalith_offload.auto's choice.

master_tier="nvme" puts the fp32 masters of NVMe chunks into their swap files (ahead of
the states): they leave the host's side of the plan and join the files and staging.

param_frac names the chunks whose working-parameter shards leave the device too: into
host memory (param_tier="host", counted with the masters) or into a swap file of their
own (param_tier="nvme": the file's bytes join nvme_bytes, and PARAM_SWAP_SLOTS staging
buffers of the largest padded shard join the host side). Such chunks keep their states
on NVMe under tier="host+nvme" (the host budget fills with the other chunks).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from megalith_core.memory import HOST_ALIGNMENT as ALIGNMENT

from .config import OffloadConfig


@dataclass(frozen=True)
class ChunkCost:
    """Bytes one chunk's training state needs on each tier.

    device: masters (when kept apart from the params) and states, if kept on the device.
    master: the fp32 master on the host, if offloaded.
    states: the optimizer states on the host, if offloaded to the host tier.
    swap: the chunk's swap file (and staging buffer), if offloaded to NVMe.
    step_staging: host buffers for one chunk's update on the host (its gradients coming
        down, its working parameters going up); HOST_STEP_SLOTS of the largest are kept.
    """

    device: int
    master: int
    states: int
    swap: int
    step_staging: int = 0
    params: int = 0  # the working-parameter shard, if offloaded (param_frac; stage 3)


def padded(nbytes: int) -> int:
    """Bytes of a swap file (and its staging buffer) holding `nbytes`: O_DIRECT moves
    whole 4096-byte blocks."""
    return -(-nbytes // ALIGNMENT) * ALIGNMENT


#: chunks the host update stages at once (megalith_zero.host_step: gradients of the next
#: chunks come down while one is updated and the last one's parameters go up)
HOST_STEP_SLOTS = 3

#: host staging buffers for parameter shards kept on NVMe (param_tier="nvme"): one
#: chunk's shard read for its gather while the next one's read is in flight (a
#: prefetch), or one chunk's new values written while the next chunk steps
PARAM_SWAP_SLOTS = 2


@dataclass(frozen=True)
class Plan:
    tiers: tuple[str, ...]  # "device", "host" or "nvme" per chunk
    slots: int  # NVMe staging buffers: 2 overlap reads with steps, 1 does not, 0: no NVMe
    slot_bytes: int
    device_bytes: int
    host_bytes: int
    nvme_bytes: int
    params_on_host: tuple[bool, ...] = ()  # per chunk (param_frac, param_tier="host")
    params_on_nvme: tuple[bool, ...] = ()  # per chunk (param_frac, param_tier="nvme")
    param_slots: int = 0  # staging buffers for the parameter files (PARAM_SWAP_SLOTS or 0)
    param_slot_bytes: int = 0


def plan(
    costs: Sequence[ChunkCost], config: OffloadConfig, param_frac: float | None = None
) -> Plan:
    """param_frac: instead of config.param_frac (automatic placement's warm-up at stage 3
    offloads every parameter shard, see megalith_offload.auto)."""
    n = len(costs)
    n_off = min(n, math.ceil(config.optim_frac * n - 1e-9))
    first = "nvme" if config.tier == "host+nvme" else config.tier
    tiers = [first] * n_off + ["device"] * (n - n_off)
    budget = config.device_budget_bytes if config.placement == "static" else None
    on_device = 0
    for i in range(n_off, n):
        if budget is not None and on_device + costs[i].device > budget:
            tiers[i] = first
        else:
            on_device += costs[i].device
    frac = config.param_frac if param_frac is None else param_frac
    offloaded_params = _offloaded_params(costs, tiers, frac)
    on_nvme = config.param_tier == "nvme"
    params_on_host = tuple(p and not on_nvme for p in offloaded_params)
    params_on_nvme = tuple(p and on_nvme for p in offloaded_params)
    off = [c for c, t in zip(costs, tiers) if t != "device"]
    nvme_masters = config.master_tier == "nvme"
    # what the host holds whichever chunks end up on NVMe: offloaded parameters (neither
    # they nor the masters move between tiers), the host update's staging (every
    # offloaded chunk needs it), the parameter files' ring, and the masters unless
    # they go to NVMe with their chunk's states
    fixed = sum(c.params for c, h in zip(costs, params_on_host) if h)
    fixed += HOST_STEP_SLOTS * max((c.step_staging for c in off), default=0)
    param_files = [padded(c.params) for c, p in zip(costs, params_on_nvme) if p]
    param_slot_bytes = max(param_files, default=0)
    param_slots = PARAM_SWAP_SLOTS if param_files else 0
    fixed += param_slots * param_slot_bytes
    if not nvme_masters:
        fixed += sum(c.master for c in off)
    if config.tier == "host+nvme":
        pinned = [i for i, p in enumerate(params_on_nvme) if p]
        _spill_to_host(costs, tiers, config.host_budget_bytes - fixed, pinned, nvme_masters)
    on_host = [c for c, t in zip(costs, tiers) if t == "host"]
    masters = fixed + (sum(c.master for c in on_host) if nvme_masters else 0)
    swapped = [swap_bytes(c, nvme_masters) for c, t in zip(costs, tiers) if t == "nvme"]
    slot_bytes = max(swapped, default=0)
    nvme = sum(swapped) + sum(param_files)
    slots = 2 if swapped else 0
    host = masters + sum(c.states for c in on_host)
    host += slots * slot_bytes
    _check_host(config, off, masters, slot_bytes, host)
    if swapped and config.host_budget_bytes is not None and host > config.host_budget_bytes:
        slots, host = 1, host - slot_bytes  # fits one staging buffer: no overlap
    return Plan(
        tuple(tiers),
        slots,
        slot_bytes,
        on_device,
        host,
        nvme,
        params_on_host,
        params_on_nvme,
        param_slots,
        param_slot_bytes,
    )


def swap_bytes(cost: ChunkCost, with_master: bool) -> int:
    """The chunk's swap file: its states, and with master_tier="nvme" its master ahead
    of them (one more padded fp32 vector)."""
    return cost.swap + (padded(cost.master) if with_master else 0)


def _offloaded_params(
    costs: Sequence[ChunkCost], tiers: list[str], frac: float
) -> tuple[bool, ...]:
    n_params = min(len(costs), math.ceil(frac * len(costs) - 1e-9))
    kept = [i for i in range(n_params) if tiers[i] == "device"]
    if kept:
        raise ValueError(
            f"OffloadConfig: param_frac={frac} offloads the parameters of the first {n_params} "
            f"of {len(costs)} chunks, but chunk {kept[0]} keeps its optimizer states on the "
            "device, whose kernel cannot write offloaded parameters; offload those states too "
            "(optim_frac >= param_frac) or lower param_frac"
        )
    return tuple(i < n_params for i in range(len(costs)))


def _spill_to_host(
    costs: Sequence[ChunkCost],
    tiers: list[str],
    room: int,
    pinned: Sequence[int] = (),
    nvme_masters: bool = False,
) -> None:
    """tier="host+nvme": offloaded chunks (all planned on NVMe) move to the host, in
    order, while `room` holds their states (and, with nvme_masters, their masters) and
    the NVMe staging the rest still needs. `pinned` chunks stay on NVMe (their
    parameter shards live in swap files)."""
    nvme = [i for i, t in enumerate(tiers) if t == "nvme" and i not in pinned]

    def on_host(i: int) -> int:
        return costs[i].states + (costs[i].master if nvme_masters else 0)

    if not pinned and sum(on_host(i) for i in nvme) <= room:  # no staging needed
        for i in nvme:
            tiers[i] = "host"
        return
    for k, i in enumerate(nvme):
        rest = [*nvme[k + 1 :], *pinned]
        staging = 2 * max((swap_bytes(costs[j], nvme_masters) for j in rest), default=0)
        if on_host(i) + staging > room:
            break
        tiers[i] = "host"
        room -= on_host(i)


def _check_host(
    config: OffloadConfig, off: list[ChunkCost], masters: int, slot_bytes: int, host: int
) -> None:
    limit = config.host_budget_bytes
    if limit is None or not off:
        return
    if config.tier == "host+nvme" and limit < masters + slot_bytes:
        raise ValueError(
            f"OffloadConfig: host_budget_bytes={limit} is too small for tier='host+nvme': the "
            f"offloaded chunks' fp32 masters (and the host update's and parameter files' "
            f"staging) take {masters} bytes and one NVMe staging buffer "
            f"{slot_bytes} bytes, {masters + slot_bytes} in all; raise it, or raise "
            "device_budget_bytes / lower optim_frac so fewer chunks are offloaded"
        )
    if config.tier == "host":
        staging = HOST_STEP_SLOTS * max(c.step_staging for c in off)
        one = min(c.master + c.states for c in off) + staging
        if limit < one:
            raise ValueError(
                f"OffloadConfig: host_budget_bytes={limit} is too small for even one chunk: "
                f"its fp32 master and optimizer states, with the host update's staging "
                f"({staging}), take {one} bytes; raise it, or use tier='nvme'"
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
            f"masters (and the host update's and parameter files' staging) take {masters} "
            f"bytes and one NVMe "
            f"staging buffer (the largest chunk's "
            f"optimizer states) {slot_bytes} bytes, {masters + slot_bytes} in all; raise it"
        )
