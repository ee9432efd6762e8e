"""Tiers: one object per place a chunk's fp32 master and optimizer states can live,
each updating its own chunks. ZeroOptimizer.step hands every chunk's update to the
tier its chunk is on (a chunk's `tier` names it) and loops over the tiers in order.

The device tier is here; the host and NVMe tiers are megalith_offload's (HostTier,
NvmeTier), with the same interface.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from megalith_core.memory import StateMemory, Usage
from megalith_core.optim import flat_states
from megalith_core.optim.rules import Rule

from .chunk import FlatChunk
from .streams import Streams


@dataclass(frozen=True)
class ChunkUpdate:
    """One chunk's update in a step."""

    chunk: FlatChunk
    group: dict[str, Any]  # the optimizer param group (hyperparameters)
    names: tuple[str, ...]  # its optimizer states
    pieces: list[tuple[int, slice, list[int]]]  # FlatChunk.step_pieces


class Tier(Protocol):
    #: the chunks' `tier` this object updates: "device", "host" or "nvme"
    name: str
    #: whether a chunk can be updated during backward (ZeroConfig.step_in_backward)
    steps_in_backward: bool

    def step(
        self, updates: Sequence[ChunkUpdate], grad_scale: float, in_backward: bool = False
    ) -> None:
        """Starts (or runs) the updates; in_backward: backward is still running."""
        ...

    def wait(self) -> None:
        """Every update started is done (in stream order on CUDA)."""
        ...

    def end_step(self, placed: bool) -> None:
        """After each step; placed: no placement warm-up ran in it."""
        ...

    def report(self) -> dict[str, tuple[int, int]]:
        """(current, peak) bytes of the state this tier holds, by kind."""
        ...

    def close(self) -> None: ...


class DeviceTier:
    """Chunks whose masters and states live beside their parameters: the engine's
    fused kernel, one call per param group and step number over all of them."""

    name = "device"
    steps_in_backward = True

    def __init__(self, rule: Rule, streams: Streams, memory: StateMemory):
        self.rule, self.streams, self.memory = rule, streams, memory
        self._in_backward = False  # updates ran on the step stream since the last wait()

    def step(
        self, updates: Sequence[ChunkUpdate], grad_scale: float, in_backward: bool = False
    ) -> None:
        by_group: dict[int, list[ChunkUpdate]] = {}
        for u in updates:
            by_group.setdefault(u.chunk.spec.group, []).append(u)
        for gi in sorted(by_group):
            batch = by_group[gi]
            for u in batch:
                u.chunk.ensure_states(u.names)
            if in_backward:  # memory-bound: beside backward's compute ([Note: zero streams])
                with self.streams.on(self.streams.step):
                    self._apply(batch, grad_scale)
                self._in_backward = True
            else:
                self._apply(batch, grad_scale)

    def _apply(self, batch: list[ChunkUpdate], grad_scale: float) -> None:
        """One fused call per step number, over the chunks of one param group."""
        work: dict[int, list[tuple[FlatChunk, slice]]] = {}
        for u in batch:
            for step, sl, _ in u.pieces:
                work.setdefault(step, []).append((u.chunk, sl))
        group, names = batch[0].group, batch[0].names
        if batch[0].chunk.state_dtype != "fp32":
            self._apply_lean(batch, grad_scale)
            return
        for step, pieces in work.items():
            c0 = pieces[0][0]
            copies = None
            if c0.master.data_ptr() != c0.shard.data_ptr():  # a separate fp32 master
                copies = [c.shard[sl] for c, sl in pieces]
            self.rule.apply(
                group,
                step,
                [c.master[sl] for c, sl in pieces],
                [c.shard_grad[sl] for c, sl in pieces],
                {n: [c.states[n][sl] for c, sl in pieces] for n in names},
                copies,
                grad_scale,
            )

    def _apply_lean(self, batch: list[ChunkUpdate], grad_scale: float) -> None:
        """Lean states: one call per shard piece, each shard on its own rounding stream
        ([Note: lean chunk states] in megalith_core.optim.flat_states)."""
        for u in batch:
            c = u.chunk
            copies = c.shard if c.master.data_ptr() != c.shard.data_ptr() else None
            seed = flat_states.stream_seed(int(u.group.get("seed", 0)), c.spec.index, c.rank)
            for step, sl, _ in u.pieces:
                flat_states.apply(
                    self.rule, u.group, step, c.master, c.shard_grad, c.states, copies,
                    grad_scale, sl, seed,
                )  # fmt: skip

    def wait(self) -> None:
        step = self.streams.step
        if step is not None and self._in_backward:
            torch.cuda.current_stream(step.device).wait_stream(step)
        self._in_backward = False

    def end_step(self, placed: bool) -> None:
        """Nothing to decide between steps."""

    def report(self) -> dict[str, Usage]:
        """The device arena's masters and states (ZeroModel.memory_report has it all)."""
        return {kind: self.memory.usage(kind) for kind in ("master", "optim_states")}

    def close(self) -> None:
        """Nothing to release: the chunks own their memory."""
