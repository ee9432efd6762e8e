"""OffloadConfig: where the optimizer states and fp32 masters of a ZeRO run live."""

from __future__ import annotations

import math
from dataclasses import dataclass

TIERS = ("host", "nvme")


@dataclass(frozen=True)
class OffloadConfig:
    """Placement of fp32 master shards and optimizer states, validated on construction.

    tier: where offloaded chunks keep their optimizer states: "host" (pinned host
        memory when CUDA is there, pageable host memory otherwise) or "nvme" (files
        in a per-run swap directory, read back before a chunk's step and written
        after it; the next chunk's read overlaps the current chunk's step). The
        fp32 masters of offloaded chunks live in host memory on either tier.
    optim_frac: the fraction of chunks whose states are offloaded (ColossalAI's
        offload_optim_frac): 1.0 offloads all, 0.0 none (unless the budget asks).
    device_budget_bytes: at most this many bytes of masters and optimizer states
        stay on the device tier; chunks past it are offloaded too. None: no limit.
    host_budget_bytes: at most this many bytes of host memory for offloaded
        masters and states (tier "host") or masters and NVMe staging buffers (tier
        "nvme"); enforced by the engine. None: no limit.
    swap_dir: the directory under which the per-run swap directory is made
        (tier "nvme"); None: the system's temporary directory.
    run_name: names the swap directory (megalith-swap-<run_name>-rank<r>-<id>).
    io_threads: threads of the engine's async file I/O.
    direct: use O_DIRECT where the filesystem allows it.
    """

    tier: str = "host"
    optim_frac: float = 1.0
    device_budget_bytes: int | None = None
    host_budget_bytes: int | None = None
    swap_dir: str | None = None
    run_name: str = "megalith"
    io_threads: int = 4
    direct: bool = True

    def __post_init__(self) -> None:
        if self.tier not in TIERS:
            raise ValueError(f"OffloadConfig: tier={self.tier!r}; expected 'host' or 'nvme'")
        frac = self.optim_frac
        if isinstance(frac, bool) or not isinstance(frac, (int, float)) or not 0 <= frac <= 1:
            raise ValueError(f"OffloadConfig: optim_frac={frac!r}; expected 0 <= optim_frac <= 1")
        if not math.isfinite(frac):
            raise ValueError(f"OffloadConfig: optim_frac={frac!r}; expected a finite number")
        for name in ("device_budget_bytes", "host_budget_bytes"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < 0):
                raise ValueError(f"OffloadConfig: {name}={value!r}; expected None or an int >= 0")
        if self.io_threads < 1:
            raise ValueError(f"OffloadConfig: io_threads={self.io_threads}; expected >= 1")
        if not self.run_name or "/" in self.run_name:
            raise ValueError(
                f"OffloadConfig: run_name={self.run_name!r}; expected a non-empty name without '/'"
            )
