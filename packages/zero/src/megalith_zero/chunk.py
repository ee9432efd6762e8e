"""FlatChunk: the buffers of one layout chunk on this rank, and the collectives that fill them.

Per chunk (C elements, shard S = C / world, this rank's shard at [lo, lo + S)):

=========== ====================== =================== ===================
buffer      stage 1                stage 2             stage 3
=========== ====================== =================== ===================
full        working params, kept   working params, kept gathered per use
shard       view of full           view of full        working params, kept
master      fp32 S (the shard itself when training in fp32 on the device tier)
full_grad   reduce dtype, kept     while reducing      while reducing
shard_grad  view of full_grad      reduce dtype S      reduce dtype S
=========== ====================== =================== ===================

With offloading (megalith_offload) a chunk's `tier` is "host" or "nvme": its
master is a separate fp32 buffer in host memory (the update writes the working
params as copies), and its optimizer states live in host memory or in a swap
file that is read into `states` only around the chunk's step. Where a chunk's state
lives is the Offloader's record (`tier`, `params_on_host`, ... read it); a FlatChunk
is a megalith_offload.OffloadableChunk, and moves between tiers are the Offloader's.

With param_frac at stage 3 the chunk's `shard` lives in host memory
(`params_on_host`), or, with param_tier="nvme", in a swap file of its own
(`params_on_nvme`): `shard` is then a meta tensor (shape and dtype, no values)
except while megalith_offload holds it in host memory (its nvme_chunk.py: the step,
the checkpoints' resident_states()); a gather reads the file through the Offloader
(its FileGather).

Model parameters are views of `full` (`param.data`), so the model computes on
the chunk's memory directly. [Note: stage 3 storage] At stage 3 `full` is a
torch storage resized to 0 bytes when released and back when gathered: autograd
keeps views of parameters it saved for backward, and those stay valid only if
the gather refills the same storage. A released chunk's parameters are not left
viewing the empty storage (reading one, `model.unwrap().weight.sum()`, would read
freed memory and crash the process): each becomes a stride-0 view of one NaN of
its dtype, so its shape, dtype and device stay right, its values read as NaN and
a write into it fails; the gather binds the views of `full` again.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

import megalith_comm as comm
from megalith_core.memory import StateMemory
from megalith_core.optim import flat_states

from .config import ZeroConfig
from .layout import Chunk

if TYPE_CHECKING:
    from megalith_offload import Offloader


@dataclass(frozen=True)
class ChunkSetup:
    """How a chunk is built on this rank, beside its layout spec and parameters."""

    rank: int
    config: ZeroConfig
    trainable: bool
    #: the megalith_offload Offloader that places the chunk's state, or None (the device)
    offloader: Offloader | None = None
    #: its param group's optimizer states (an NVMe chunk's file holds them)
    state_names: tuple[str, ...] = ()
    #: their format, the group's state_dtype ([Note: lean chunk states] in
    #: megalith_core.optim.flat_states)
    state_dtype: str = "fp32"


class FlatChunk:
    def __init__(
        self,
        spec: Chunk,
        params: list[torch.nn.Parameter],
        memory: StateMemory,
        setup: ChunkSetup,
    ):
        rank, config, offloader = setup.rank, setup.config, setup.offloader
        self.spec = spec
        self.params = params
        self.rank = rank
        self.stage = config.stage
        self.trainable = trainable = setup.trainable
        #: the format of the optimizer states (megalith_core.optim.flat_states)
        self.state_dtype = setup.state_dtype
        self.memory = memory
        #: where the chunk's state lives is the Offloader's record (see the properties)
        self.offloader = offloader
        self.lo = rank * spec.shard_numel
        wd, rd = config.param_dtype, config.grad_reduce_dtype
        self.param_dtype, self.reduce_dtype = wd, rd
        device = memory.device
        n, s = spec.numel, spec.shard_numel

        #: what a gather in flight reads, kept alive until release()
        self._gather_input: object | None = None
        # a shard of its own at stage 3; a view of `full` otherwise, and with
        # param_tier="nvme" until the Offloader puts it in its file (place() below)
        own_shard = self.stage == 3 and not self.params_on_nvme
        if own_shard:
            owner = self.host if self.params_on_host else memory
            self.shard = owner.zeros("params", s, wd)
        if self.stage == 3:
            self.full = torch.zeros(n, dtype=wd, device=device)
            self._storage = self.full.untyped_storage()
            self._full_bytes = self._storage.nbytes()
            memory.gathered.add(self._full_bytes)
            self.is_gathered = True
        else:
            self.full = memory.zeros("params", n, wd)
        if not own_shard:
            self.shard = self.full[self.lo : self.lo + s]

        # Master values come from the parameters as the user built them (fp32),
        # before they are rounded to the working dtype.
        if self.host is not None or (trainable and wd != torch.float32):
            if self.masters_on_nvme:  # the Offloader puts it in its file (place() below)
                self.master = torch.zeros(s, dtype=torch.float32)
            else:
                self.master = (self.host or memory).zeros("master", s, torch.float32)
            for seg in spec.segments(rank):
                src = params[spec.slots.index(seg.slot)].detach().reshape(-1)
                self.master[seg.shard_start : seg.shard_start + seg.length].copy_(
                    src[seg.param_start : seg.param_start + seg.length]
                )
        with torch.no_grad():
            for slot, p in zip(spec.slots, params):
                self.full[slot.offset : slot.offset + slot.numel].copy_(p.detach().reshape(-1))
        if own_shard:
            self.shard.copy_(self.full[self.lo : self.lo + s])
        if offloader is not None:
            offloader.place(self, setup.state_names)
        if trainable and wd == torch.float32 and self.host is None:
            self.master = self.shard
        self._bind_params()
        if self.stage == 3:
            self.release()

        self.full_grad: torch.Tensor | None = None
        if trainable and self.stage == 1:
            self.full_grad = memory.zeros("grads", n, rd)
            self.shard_grad = self.full_grad[self.lo : self.lo + s]
        elif trainable:
            self.shard_grad = memory.zeros("grads", s, rd)
        self._stage1_acc: torch.Tensor | None = None
        self._reduce_out: torch.Tensor | None = None
        self.present = [False] * len(spec.slots)  # grad in full_grad since the last reduction
        self.used = [False] * len(spec.slots)  # grad arrived on this rank since the last step
        self.grad_valid = False  # shard_grad holds reduced gradients since the last step
        self.states: dict[str, torch.Tensor] = {}
        self.steps = [0] * len(spec.slots)  # optimizer steps taken, per parameter

    # -- where the state lives (the Offloader's record) ----------------------------------
    @property
    def tier(self) -> str:
        """Where the fp32 master and optimizer states live: "device", "host" or "nvme"."""
        return "device" if self.offloader is None else self.offloader.tier_of(self.spec.index)

    @property
    def host(self) -> StateMemory | None:
        """The host arena of an offloaded chunk."""
        return None if self.offloader is None else self.offloader.host_of(self.spec.index)

    @property
    def masters_on_nvme(self) -> bool:
        """The fp32 master lives in the states' swap file (master_tier="nvme"): `master`
        is a meta tensor except around the chunk's step and in the checkpoints."""
        return self.offloader is not None and self.offloader.masters_on_nvme(self.spec.index)

    @property
    def params_on_host(self) -> bool:
        """Stage 3 with param_frac: the shard lives in host memory, copied up per gather."""
        return self.offloader is not None and self.offloader.params_on_host(self.spec.index)

    @property
    def params_on_nvme(self) -> bool:
        """Stage 3 with param_tier="nvme": the shard lives in a swap file of its own."""
        return self.offloader is not None and self.offloader.params_on_nvme(self.spec.index)

    @property
    def shard(self) -> torch.Tensor:
        return self._shard

    @shard.setter
    def shard(self, shard: torch.Tensor) -> None:
        self._shard = shard
        # What a gather read from the old shard need not live on: the Offloader moves a
        # shard only after a step, when no gather is in flight, and stages a shard kept
        # in a file only beside a gather that holds its own input (FileGather.source).
        self._gather_input = None

    # -- stage 3: gather and release ----------------------------------------
    def gather(self, group: comm.ProcessGroup) -> comm.Handle | None:
        """Starts refilling `full` from every rank's shard; None when already there."""
        if self.is_gathered:
            return None
        self._storage.resize_(self._full_bytes)
        self._bind_params()
        self.memory.gathered.add(self._full_bytes)
        self.is_gathered = True
        if self.params_on_nvme:
            gather = self._gather_input = self.offloader.gather_from_file(self, group)
            return gather
        src = self.shard
        if src.device != self.full.device:  # offloaded: up first, on the caller's stream
            src = self._gather_input = src.to(self.full.device, non_blocking=True)
        return comm.all_gather(self.full, src, group=group, async_op=True)

    def release(self) -> None:
        self._gather_input = None
        if self.stage == 3 and self.is_gathered:
            self._unbind_params()
            self._storage.resize_(0)
            self.memory.gathered.add(-self._full_bytes)
            self.is_gathered = False

    def _bind_params(self) -> None:
        for slot, p in zip(self.spec.slots, self.params):
            p.data = self.full[slot.offset : slot.offset + slot.numel].view(slot.shape)

    def _unbind_params(self) -> None:
        """Released parameters view one NaN, not freed memory ([Note: stage 3 storage])."""
        nan = torch.full((1,), float("nan"), dtype=self.full.dtype, device=self.full.device)
        for slot, p in zip(self.spec.slots, self.params):
            p.data = nan.expand(slot.shape) if slot.shape else nan[0]

    # -- gradients ------------------------------------------------------------
    def add_grad(self, index: int, grad: torch.Tensor) -> None:
        """Adds one parameter's gradient (this rank's, unreduced) to full_grad."""
        slot = self.spec.slots[index]
        if self.full_grad is None:
            self.full_grad = self.memory.zeros(
                "grads_in_flight", self.spec.numel, self.reduce_dtype
            )
        elif (
            self.stage == 1
            and self.grad_valid
            and self._stage1_acc is None
            and not any(self.present)
        ):
            # Stage 1 reduces in place: keep the reduced shard before new grads overwrite it.
            self._stage1_acc = self.memory.empty(
                "grads_in_flight", self.spec.shard_numel, self.reduce_dtype
            )
            self._stage1_acc.copy_(self.shard_grad)
            self.grad_valid = False
        dst = self.full_grad[slot.offset : slot.offset + slot.numel]
        if self.present[index]:
            dst.add_(grad.reshape(-1))
        else:
            dst.copy_(grad.reshape(-1))
        self.present[index] = True
        self.used[index] = True

    def complete(self) -> bool:
        return all(self.present)

    def begin_reduce(self) -> torch.Tensor:
        """The bookkeeping of a reduction, before its collective: full_grad is whole
        (parameters unused here contribute zeros); returns where this rank's reduced
        shard goes (stage 1: shard_grad, in full_grad; stages 2, 3: shard_grad, or a
        buffer finish_reduce() adds into it when accumulating)."""
        if self.full_grad is None:
            self.full_grad = self.memory.zeros(
                "grads_in_flight", self.spec.numel, self.reduce_dtype
            )
        for i, slot in enumerate(self.spec.slots):
            if not self.present[i]:  # unused here: contributes zeros
                self.full_grad[slot.offset : slot.offset + slot.numel].zero_()
        self.present = [False] * len(self.spec.slots)
        if self.stage != 1 and self.grad_valid:
            self._reduce_out = self.memory.empty(
                "grads_in_flight", self.spec.shard_numel, self.reduce_dtype
            )
            return self._reduce_out
        return self.shard_grad

    def reduce(self, group: comm.ProcessGroup) -> comm.Handle:
        """Starts averaging full_grad over the group (stage 1) or reduce-scattering
        it into this rank's shard (stages 2, 3). finish_reduce() completes it.
        (With shard_each_param a bucket of chunks reduces as one: buckets.py.)"""
        out = self.begin_reduce()
        if self.stage == 1:
            return comm.all_reduce(self.full_grad, op="avg", group=group, async_op=True)
        return comm.reduce_scatter(out, self.full_grad, op="avg", group=group, async_op=True)

    def finish_reduce(self) -> None:
        if self.stage == 1:
            if self._stage1_acc is not None:
                self.shard_grad.add_(self._stage1_acc)
                self._stage1_acc = None
        else:
            if self._reduce_out is not None:
                self.shard_grad.add_(self._reduce_out)
                self._reduce_out = None
            self.full_grad = None
        self.grad_valid = True

    def zero_grad(self) -> None:
        self.grad_valid = False
        self.used = [False] * len(self.spec.slots)
        self.present = [False] * len(self.spec.slots)
        self._stage1_acc = None
        if self.stage != 1:
            self.full_grad = None

    # -- optimizer --------------------------------------------------------------
    def master_values(self) -> torch.Tensor:
        """The fp32 master; read from the swap file (a new host tensor) when it is there."""
        return self.master if self.offloader is None else self.offloader.master_values(self)

    def ensure_states(self, names: tuple[str, ...]) -> None:
        """The optimizer states `names` exist (zeros until first stepped); an offloaded
        chunk's where the Offloader puts them."""
        if self.offloader is not None:
            self.offloader.ensure_states(self, names)
            return
        flat_states.allocate(
            lambda n, dtype: self.memory.zeros("optim_states", n, dtype),
            names,
            self.state_dtype,
            self.spec.shard_numel,
            self.states,
        )

    def step_pieces(self, used: list[bool]) -> list[tuple[int, slice, list[int]]]:
        """(step number to take, shard range, slot indices) runs for the fused update.

        The whole shard is one piece when every parameter in it was used and all
        have taken the same number of steps (the usual case); otherwise one piece
        per run of used parameters with equal step counts (padding is skipped).
        """
        segs = self.spec.segments(self.rank)
        if not segs:
            return []
        index = {s: i for i, s in enumerate(self.spec.slots)}
        mine = [index[s.slot] for s in segs]
        if all(used[i] for i in mine) and len({self.steps[i] for i in mine}) == 1:
            return [(self.steps[mine[0]] + 1, slice(0, self.spec.shard_numel), mine)]
        pieces: list[tuple[int, slice, list[int]]] = []
        for seg, i in zip(segs, mine):
            if not used[i]:
                continue
            step = self.steps[i] + 1
            a, b = seg.shard_start, seg.shard_start + seg.length
            if pieces and pieces[-1][0] == step and pieces[-1][1].stop == a:
                prev = pieces[-1]
                pieces[-1] = (step, slice(prev[1].start, b), [*prev[2], i])
            else:
                pieces.append((step, slice(a, b), [i]))
        return pieces
