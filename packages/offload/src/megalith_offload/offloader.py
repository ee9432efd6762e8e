"""Offloader: one rank's placement plan with the host memory and swap files behind it."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping

import torch

import megalith_comm as comm
from megalith_core import _engine
from megalith_core.memory import StateMemory
from megalith_core.optim import flat_states

from . import nvme_chunk
from .chunk import OffloadableChunk
from .config import OffloadConfig
from .file_gather import FileGather
from .placement import ChunkCost, Plan, plan
from .swap import SwapStore
from .threads import host_threads


class Offloader:
    """Plans where each chunk's states live, owns the host arena and NVMe store, and
    keeps the record of where every chunk is: its tier ("device", "host" or "nvme"),
    whether its parameter shard lives in host memory or in a swap file, and whether
    its master lives in the swap file. Only its own methods change that record.

    Chunks are named by their key (the layout's chunk index); a key the plan does not
    hold (a frozen chunk) is on the device.

    report() gives (current, peak) bytes per "<kind>@<tier>" from the engine's
    accounting: master@host, optim_states@host, swap_staging@host, optim_states@nvme,
    and with param_frac params@host, or (param_tier="nvme") params@nvme (file bytes)
    and param_swap_staging@host.
    """

    def __init__(
        self,
        config: OffloadConfig,
        costs: Mapping[int, ChunkCost],
        rank: int,
        pinned: bool | None = None,
        param_frac: float | None = None,
    ):
        """costs: per key, in layout order; param_frac: instead of config.param_frac
        (see plan)."""
        self.config = config
        self._position = {key: i for i, key in enumerate(costs)}
        self.plan: Plan = plan(list(costs.values()), config, param_frac)
        self._tiers = list(self.plan.tiers)  # as placed now (auto placement changes them)
        self._params_on_host = list(self.plan.params_on_host or [False] * len(costs))
        kinds = {"host": ("master", "optim_states"), "nvme": ("master", "swap_staging")}.get(
            config.tier, ("master", "optim_states", "swap_staging")
        )
        if self.plan.param_slots:
            kinds = (*kinds, "param_swap_staging")
        self.host = StateMemory.host(config.host_budget_bytes, pinned, kinds)
        if any(t != "device" for t in self._tiers):
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

    # -- where a chunk is ---------------------------------------------------------
    def tier_of(self, key: int) -> str:
        i = self._position.get(key)
        return "device" if i is None else self._tiers[i]

    @property
    def tiers(self) -> tuple[str, ...]:
        """Per planned chunk, in layout order, as placed now."""
        return tuple(self._tiers)

    def params_on_host(self, key: int) -> bool:
        """Whether the chunk's working-parameter shard lives in host memory (param_frac)."""
        i = self._position.get(key)
        return i is not None and self._params_on_host[i]

    def params_on_nvme(self, key: int) -> bool:
        """Whether the chunk's working-parameter shard lives in a swap file (param_tier)."""
        i = self._position.get(key)
        return i is not None and bool(self.plan.params_on_nvme) and self.plan.params_on_nvme[i]

    def masters_on_nvme(self, key: int) -> bool:
        """Whether the chunk's fp32 master lives in its states' swap file (master_tier)."""
        return self.tier_of(key) == "nvme" and self.config.master_tier == "nvme"

    def host_of(self, key: int) -> StateMemory | None:
        """The host arena holding an offloaded chunk's master (and host states)."""
        return self.host if self.tier_of(key) != "device" else None

    def params_off_device(self, key: int) -> bool:
        return self.params_on_host(key) or self.params_on_nvme(key)

    # -- a chunk's tensors where the record puts them -------------------------------
    def swap_names(self, key: int, names: tuple[str, ...]) -> tuple[str, ...]:
        """The vectors of an NVMe chunk's swap file, for optimizer states `names`."""
        return (SwapStore.MASTER, *names) if self.masters_on_nvme(key) else names

    def place(self, chunk: OffloadableChunk, names: tuple[str, ...]) -> None:
        """Puts a chunk just built into its swap files: its parameter shard
        (param_tier="nvme") and its fp32 master (master_tier="nvme"), each then a meta
        tensor in the chunk; `names`: its optimizer states."""
        key = chunk.spec.index
        if self.params_on_nvme(key):
            nvme_chunk.put_params(self.swap.params, chunk)
        if self.masters_on_nvme(key):
            nvme_chunk.put_master(self.swap, chunk, self.swap_names(key, names))

    def ensure_states(self, chunk: OffloadableChunk, names: tuple[str, ...]) -> None:
        """The optimizer states `names` exist, zeros until first stepped: in the host
        arena, in device memory for a chunk on the device, or for an NVMe chunk in its
        swap file (`chunk.states` holds them only around its step)."""
        key = chunk.spec.index
        fmt = getattr(chunk, "state_dtype", "fp32")
        if self.tier_of(key) == "nvme":
            in_file = self.swap_names(key, names)
            if in_file:
                self.swap.ensure(key, in_file, chunk.spec.shard_numel, fmt)
            return
        arena = self.host_of(key) or chunk.memory
        flat_states.allocate(
            lambda n, dtype: arena.zeros("optim_states", n, dtype),
            names,
            fmt,
            chunk.spec.shard_numel,
            chunk.states,
        )

    def master_values(self, chunk: OffloadableChunk) -> torch.Tensor:
        """The fp32 master; read from the swap file (a new host tensor) when it is there."""
        if chunk.master.device.type != "meta":
            return chunk.master
        return nvme_chunk.master_values(self.swap, chunk)

    def staged_params(
        self, chunk: OffloadableChunk, read: bool = True
    ) -> contextlib.AbstractContextManager[None]:
        """Inside: a parameter shard kept in a swap file is in host staging as
        `chunk.shard` (nvme_chunk.staged_params); other chunks: nothing to do."""
        if not self.params_on_nvme(chunk.spec.index):
            return contextlib.nullcontext()
        return nvme_chunk.staged_params(self.swap.params, chunk, read)

    def gather_from_file(self, chunk: OffloadableChunk, group: comm.ProcessGroup) -> FileGather:
        """Starts the stage-3 gather of a chunk whose parameter shard is in a swap file."""
        return FileGather(self.swap.params, chunk, group)

    # -- moves (automatic placement) ----------------------------------------------
    def move_to_device(self, chunk: OffloadableChunk, names: tuple[str, ...]) -> None:
        """Moves an offloaded chunk's fp32 master and optimizer states (`names`) to the
        device tier: device memory is allocated and counted by the engine, the values
        copied, the host copies freed (NVMe: the file dropped); the optimizer steps the
        chunk with the device kernel from then on."""
        key = chunk.spec.index
        if self.tier_of(key) == "device":
            return
        s = chunk.spec.shard_numel
        if chunk.shard.dtype == torch.float32:
            master = chunk.shard  # fp32 on the device tier: the shard is the master
        else:
            master = chunk.memory.empty("master", s, torch.float32)
        on_nvme, in_file = self.tier_of(key) == "nvme", self.masters_on_nvme(key)
        if not in_file:
            master.copy_(chunk.master)  # (equal already when the shard is the master)
        fmt = getattr(chunk, "state_dtype", "fp32")
        states = {
            n: chunk.memory.empty("optim_states", count, dtype)
            for n, (dtype, count) in flat_states.specs(names, fmt, s).items()
        }
        if on_nvme:
            loaded = {SwapStore.MASTER: master, **states} if in_file else states
            if loaded and self.swap.has(key):
                self.swap.load(key, loaded)
            else:  # never stepped: the states start at zeros
                for t in states.values():
                    t.zero_()
            self.swap.drop(key)
        else:
            for n, t in states.items():
                if n in chunk.states:
                    t.copy_(chunk.states[n])
                else:
                    t.zero_()
        chunk.master, chunk.states = master, states
        self._tiers[self._position[key]] = "device"

    def move_params_to_device(self, chunk: OffloadableChunk) -> None:
        """Moves a parameter shard kept in host memory to the device (automatic placement
        at stage 3): device memory from the engine, the values copied, the host copy
        freed. Gathers read it there from then on; the host update of the chunk (its
        states still offloaded) sends the new values up as for any device shard."""
        key = chunk.spec.index
        if not self.params_on_host(key):
            return
        shard = chunk.memory.empty("params", chunk.spec.shard_numel, chunk.shard.dtype)
        shard.copy_(chunk.shard)
        chunk.shard = shard
        self._params_on_host[self._position[key]] = False

    # -- accounting ---------------------------------------------------------------
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
