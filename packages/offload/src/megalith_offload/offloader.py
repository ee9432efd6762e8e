"""Offloader: one rank's placement plan with the host memory and swap files behind it."""

from __future__ import annotations

from collections.abc import Sequence

from megalith_core import _engine

from .config import OffloadConfig
from .host import HostTier, host_threads
from .placement import ChunkCost, Plan, plan
from .swap import SwapStore


class Offloader:
    """Plans where each chunk's states live and owns the host tier and NVMe store.

    report() gives (current, peak) bytes per "<kind>@<tier>" from the engine's
    accounting: master@host, optim_states@host, swap_staging@host, optim_states@nvme,
    and with param_frac params@host, or (param_tier="nvme") params@nvme (file bytes)
    and param_swap_staging@host.
    """

    def __init__(
        self,
        config: OffloadConfig,
        costs: Sequence[ChunkCost],
        rank: int,
        pinned: bool | None = None,
        param_frac: float | None = None,
    ):
        """param_frac: instead of config.param_frac (see plan)."""
        self.config = config
        self.plan: Plan = plan(costs, config, param_frac)
        self.tiers = list(self.plan.tiers)  # as placed now (auto placement changes them)
        kinds = {"host": ("master", "optim_states"), "nvme": ("master", "swap_staging")}.get(
            config.tier, ("master", "optim_states", "swap_staging")
        )
        if self.plan.param_slots:
            kinds = (*kinds, "param_swap_staging")
        self.host = HostTier(config.host_budget_bytes, pinned, kinds)
        if any(t != "device" for t in self.tiers):
            _engine.set_num_threads(host_threads(config.cpu_threads))
        self.swap: SwapStore | None = None
        if self.plan.slots:
            self.swap = SwapStore(
                config,
                rank,
                self.host,
                self.plan.slots,
                self.plan.slot_bytes,
                self.plan.param_slots,
                self.plan.param_slot_bytes,
            )

    def tier(self, index: int) -> str:
        return self.tiers[index]

    def params_on_host(self, index: int) -> bool:
        """Whether the chunk's working-parameter shard leaves the device (param_frac): for
        host memory, or (params_on_nvme) for a swap file read through host staging."""
        return self.params_on_nvme(index) or (
            bool(self.plan.params_on_host) and self.plan.params_on_host[index]
        )

    def params_on_nvme(self, index: int) -> bool:
        """Whether the chunk's working-parameter shard lives in a swap file (param_tier)."""
        return bool(self.plan.params_on_nvme) and self.plan.params_on_nvme[index]

    @property
    def offloaded(self) -> list[int]:
        return [i for i, t in enumerate(self.tiers) if t != "device"]

    def report(self) -> dict[str, tuple[int, int]]:
        out = {f"{k}@host": v for k, v in self.host.report().items()}
        if self.swap is not None:
            out.update(self.swap.report())
        return out

    def reset_peak(self) -> None:
        self.host.reset_peak()
        if self.swap is not None:
            self.swap.reset_peak()

    def close(self) -> None:
        """Removes the swap directory (idempotent); host memory goes with its tensors."""
        if self.swap is not None:
            self.swap.close()
