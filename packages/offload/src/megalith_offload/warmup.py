"""AutoPlacement: the warm-up of placement="auto" ([Note: auto placement] in auto.py)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence

import torch

import megalith_comm as comm
from megalith_core.memory import StateMemory

from . import auto
from .chunk import OffloadableChunk
from .offloader import Offloader
from .resident import StateNames

FLOAT = 4


class AutoPlacement:
    """Measures the first step (forward and backward through the model, then the
    optimizer's step) and then moves the chunks that fit the budget back to the
    device tier, through the Offloader's moves.

    After finish(): `footprint` (the warm-up's peaks), `room` (bytes the budget left for
    masters and states on the device), `moved` (the chunk indices whose masters and
    states moved back), `params_moved` (stage 3: those whose parameter shards did) and
    `kept_bytes` (stage 3: what the moves left, for gathered chunks kept from forward
    to backward: they are held at the step's peak, which the room was measured at).
    """

    def __init__(
        self,
        budget: int,
        headroom: float,
        memory: StateMemory,
        chunks: Sequence[OffloadableChunk],
        offloader: Offloader,
        prefetch_bytes: int = 0,
        keep_gathered: Callable[[int], None] | None = None,
    ):
        """memory: the device arena; prefetch_bytes: stage 3's gathered chunks that
        prefetching holds from the second step on (the warm-up records the order and
        does not prefetch yet); keep_gathered(bytes): stage 3, told the room left after
        the moves for chunks kept gathered from forward to backward."""
        self.budget, self.headroom = budget, headroom
        self.prefetch_bytes = prefetch_bytes
        self.memory, self.chunks, self.offloader = memory, list(chunks), offloader
        self.meter = auto.NonModelMeter(memory.device, self._param_storages)
        self.pending = True
        self.footprint: auto.Footprint | None = None
        self.room: int | None = None
        self.moved: list[int] = []
        self.params_moved: list[int] = []
        self.keep_gathered = keep_gathered
        self.kept_bytes = 0

    def _param_storages(self) -> list[int]:
        return [c.full.untyped_storage().data_ptr() for c in self.chunks]

    @contextlib.contextmanager
    def forward(self) -> Iterator[None]:
        """Around the model's forward while the warm-up runs; its first forward starts
        the measurement (and resets the engine's peak counters)."""
        if not self.meter.running:
            self.memory.reset_peak()
            self.meter.start()
        with self.meter.forward():
            yield

    def finish(self, group: comm.ProcessGroup, names_of: StateNames) -> None:
        """Ends the warm-up: the footprint (the max over the group, so that every rank
        decides alike), the room it leaves, and the chunks moved back."""
        self.pending = False
        non_model = self.meter.stop()
        report = self.memory.report()
        kinds = ["params", "grads", "grads_in_flight", "master", "optim_states"]
        if self.memory.device.type != "cuda":  # on CUDA, torch's peak holds them
            kinds.append("gathered")
        vec = torch.tensor(
            [non_model, *(report[k].peak_bytes for k in kinds)],
            dtype=torch.float64,
            device=self.memory.device,
        )
        comm.all_reduce(vec, op="max", group=group)
        values = [int(v) for v in vec.cpu().tolist()]
        model = dict(zip(kinds, values[1:]))
        model["prefetch"] = self.prefetch_bytes
        self.footprint = auto.Footprint(values[0], model)
        self.room = auto.check_warmup(self.budget, self.headroom, self.footprint)
        trainable = [c for c in self.chunks if c.trainable]
        mixed = int(any(c.shard.dtype != torch.float32 for c in trainable))
        costs, names, shards = [], {}, []
        for c in trainable:
            key = c.spec.index
            if self.offloader.tier_of(key) != "device":
                names[key] = names_of(c)
                costs.append((key, FLOAT * c.spec.shard_numel * (len(names[key]) + mixed)))
            if self.offloader.params_on_host(key):  # stage 3 ([Note: auto placement], 4.)
                shards.append((key, c.spec.shard_numel * c.shard.element_size()))
        self.params_moved, self.moved = auto.choose_with_params(shards, costs, self.room)
        moved_bytes = sum(b for k, b in shards if k in self.params_moved)
        moved_bytes += sum(b for k, b in costs if k in self.moved)
        if self.keep_gathered is not None:
            self.kept_bytes = max(0, self.room - moved_bytes)
            self.keep_gathered(self.kept_bytes)
        by_key = {c.spec.index: c for c in self.chunks}
        for k in self.params_moved:
            self.offloader.move_params_to_device(by_key[k])
        for k in self.moved:
            self.offloader.move_to_device(by_key[k], names[k])
