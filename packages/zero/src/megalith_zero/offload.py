"""ZeRO-Offload: the bridge to megalith_offload, which decides per chunk where the fp32
master and the optimizer states live ("device", "host" or "nvme"), and, with
placement="auto", the warm-up that decides it from a measured step (AutoPlacement;
see [Note: auto placement] in megalith_offload/auto.py).

megalith_offload is optional: it is imported behind a guard here, and only a
ZeroConfig that asks for offloading needs it.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, TypeVar

import torch

import megalith_comm as comm
from megalith_core.optim.rules import Rule

from .config import ZeroConfig
from .layout import Layout

try:
    import megalith_offload
except ImportError:  # megalith_zero works without it; only offloading needs it
    megalith_offload = None

if TYPE_CHECKING:
    from .chunk import FlatChunk

FLOAT = 4


def require_offload() -> Any:
    if megalith_offload is None:
        raise ImportError(
            "megalith_zero: ZeroConfig(offload=...) needs megalith-offload: "
            "pip install megalith-offload (or megalith-zero[offload])"
        )
    return megalith_offload


def make_offloader(
    config: ZeroConfig,
    layout: Layout,
    optimizer: torch.optim.Optimizer,
    rule: Rule,
    rank: int,
    device: torch.device,
) -> tuple[Any, dict[int, int]] | tuple[None, dict[int, int]]:
    """(the Offloader, plan index per trainable chunk index), or (None, {}) without offload."""
    if config.offload is None:
        return None, {}
    mo = require_offload()
    costs, index = chunk_costs(config, layout, optimizer, rule)
    # Pinned host memory only pays off (and only exists) beside a GPU.
    pinned = None if device.type == "cuda" else False
    return mo.Offloader(config.offload, costs, rank, pinned, warmup_param_frac(config)), index


def chunk_costs(
    config: ZeroConfig, layout: Layout, optimizer: torch.optim.Optimizer, rule: Rule
) -> tuple[list[Any], dict[int, int]]:
    """(megalith_offload.ChunkCost per trainable chunk, plan index per chunk index): the
    bytes each chunk's training state takes on each tier."""
    mo = require_offload()
    mixed = config.param_dtype != torch.float32
    wd = torch.empty((), dtype=config.param_dtype).element_size()
    rd = torch.empty((), dtype=config.grad_reduce_dtype).element_size()
    costs, index = [], {}
    for spec in layout.chunks:
        if spec.group < 0:
            continue
        n_states = len(rule.state_names(optimizer.param_groups[spec.group]))
        s = spec.shard_numel
        index[spec.index] = len(costs)
        costs.append(
            mo.ChunkCost(
                device=FLOAT * s * (n_states + int(mixed)),
                master=FLOAT * s,
                states=FLOAT * s * n_states,
                swap=mo.file_bytes(s, n_states),
                step_staging=s * (wd + rd),
                params=s * wd,
            )
        )
    return costs, index


def warmup_param_frac(config: ZeroConfig) -> float | None:
    """The param_frac the plan starts from instead of the config's: automatic placement
    at stage 3 runs its warm-up with every parameter shard on the host too (static full
    offload), see params_offloadable; None: the config's."""
    return 1.0 if params_offloadable(config) else None


def params_offloadable(config: ZeroConfig) -> bool:
    """Whether automatic placement moves parameter shards too: at stage 3, where each
    rank keeps only its shards, the warm-up offloads them with the masters and states
    (the static full offload, so that auto fits wherever that fits) and the placement
    brings back those that fit."""
    off = config.offload
    return off is not None and off.placement == "auto" and config.stage == 3


def swapped_states(
    offloader: Any, chunks: list[tuple[FlatChunk, tuple[str, ...]]]
) -> Iterator[FlatChunk]:
    """Yields each NVMe chunk with its states (names given per chunk) read into host
    memory (`chunk.states`), and its master (`chunk.master`) when that lives in the
    file too; written back when the caller moves on. The next chunk's read overlaps
    the caller's work on this one."""
    if not chunks:
        return
    stateless = [c for c, names in chunks if not c.swap_names(names)]
    yield from stateless
    by_key = {c.spec.index: c for c, names in chunks if c.swap_names(names)}
    for c, names in chunks:
        c.ensure_states(names)
    for key, states in offloader.swap.stream(list(by_key)):
        c = by_key[key]
        placeholder = c.master
        if c.masters_on_nvme:
            c.master = states.pop(offloader.swap.MASTER)
        c.states = states
        try:
            yield c
        finally:
            c.states = {}
            c.master = placeholder


@contextlib.contextmanager
def resident_states(zopt: Any) -> Iterator[None]:
    """Inside: every NVMe chunk's states are plain host tensors in `chunk.states`, and
    every parameter shard kept in a swap file one in `chunk.shard` (for checkpoints,
    which read and write them directly); written back on a clean exit."""
    groups = zopt.optimizer.param_groups
    swapped = [c for c in zopt.chunks if c.tier == "nvme"]
    with_params = [c for c in swapped if c.params_on_nvme]
    names = {id(c): zopt.rule.state_names(groups[c.spec.group]) for c in swapped}
    swapped = [c for c in swapped if c.swap_names(names[id(c)])]
    files: dict[int, dict[str, torch.Tensor]] = {}  # what each chunk's file holds
    for c in swapped:
        c.ensure_states(names[id(c)])
        files[id(c)] = {
            n: torch.empty(c.spec.shard_numel, dtype=torch.float32)
            for n in c.swap_names(names[id(c)])
        }
        c.swap.load(c.spec.index, files[id(c)])
        c.states = dict(files[id(c)])
        if c.masters_on_nvme:
            c.master = c.states.pop(c.swap.MASTER)
    clean = False
    try:
        for c in with_params:
            c.resident_params()
        yield
        for c in swapped:
            c.swap.store(c.spec.index, files[id(c)])
        clean = True
    finally:
        for c in with_params:
            c.store_params(write=clean)
        for c in swapped:
            c.states = {}
            if c.masters_on_nvme:
                c.master = c._master_placeholder()


def auto_budget(config: ZeroConfig, layout: Layout, device: torch.device) -> int | None:
    """placement="auto": the device budget in bytes, checked against the model state that
    stays on the device whatever the placement (no collective has run yet); None for
    static placement."""
    if config.offload is None or config.offload.placement != "auto":
        return None
    mo = require_offload()
    budget = mo.auto.device_budget(config.offload.device_budget_bytes, device)
    movable = params_offloadable(config)
    kept = resident_state(config, layout, lambda spec: movable and spec.group >= 0)
    mo.auto.check_resident(budget, mo.auto.Resident(*kept))
    return budget


def resident_state(
    config: ZeroConfig, layout: Layout, shard_offloaded: Callable[[Any], bool]
) -> tuple[int, int, int, int, int, int]:
    """Device bytes of the model state no optimizer-state placement moves, per rank:
    (working params, gradients, the largest chunk's gradients in flight, the largest
    gathered chunk (stage 3), and the smallest trainable chunk's share of those with its
    index). shard_offloaded(chunk spec): its parameter shard is off the device."""
    wd = torch.empty((), dtype=config.param_dtype).element_size()
    rd = torch.empty((), dtype=config.grad_reduce_dtype).element_size()
    stage = config.stage
    params = grads = in_flight = gathered = 0
    one: tuple[int, int] | None = None
    for spec in layout.chunks:
        n, s, trains = spec.numel, spec.shard_numel, spec.group >= 0
        p = 0 if shard_offloaded(spec) else (s if stage == 3 else n) * wd
        g = ((n if stage == 1 else s) * rd) if trains else 0
        f = n * rd if trains and stage > 1 else 0
        q = n * wd if stage == 3 else 0
        params, grads = params + p, grads + g
        in_flight, gathered = max(in_flight, f), max(gathered, q)
        if trains and (one is None or p + g + f + q < one[0]):
            one = (p + g + f + q, spec.index)
    one = one or (0, -1)
    return params, grads, in_flight, gathered, one[0], one[1]


class AutoPlacement:
    """The warm-up of placement="auto": measures the first step (forward and backward
    through ZeroModel, then ZeroOptimizer.step) and then moves the chunks that fit the
    budget back to the device tier.

    After finish(): `footprint` (the warm-up's peaks), `room` (bytes the budget left for
    masters and states on the device), `moved` (the chunk indices whose masters and
    states moved back), `params_moved` (stage 3: those whose parameter shards did) and, at
    stage 3, `kept_bytes` (what the moves left, for gathered chunks kept from forward
    to backward: they are held at the step's peak, which the room was measured at).
    """

    def __init__(
        self,
        budget: int,
        headroom: float,
        memory: Any,
        chunks: list[FlatChunk],
        offloader: Any,
        plan_index: dict[int, int],
        prefetch_bytes: int = 0,
        stage3: Any = None,
    ):
        mo = require_offload()
        self.budget, self.headroom = budget, headroom
        #: stage 3: gathered chunks that prefetching holds from the second step on (the
        #: warm-up records the order and does not prefetch yet)
        self.prefetch_bytes = prefetch_bytes
        self.memory, self.chunks = memory, chunks
        self.offloader, self.plan_index = offloader, plan_index
        self.meter = mo.auto.NonModelMeter(memory.device, self._param_storages)
        self.pending = True
        self.footprint: Any = None
        self.room: int | None = None
        self.moved: list[int] = []
        #: stage 3: the chunks whose parameter shards moved back to the device
        self.params_moved: list[int] = []
        #: stage 3: the room left after the moves, given to Stage3Hooks for chunks kept
        #: gathered from forward to backward ([Note: kept chunks])
        self.stage3 = stage3
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

    def finish(self, group: comm.ProcessGroup, optimizer: Any, rule: Rule) -> None:
        """Ends the warm-up: the footprint (the max over the group, so that every rank
        decides alike), the room it leaves, and the chunks moved back."""
        mo = require_offload()
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
        self.footprint = mo.auto.Footprint(values[0], model)
        self.room = mo.auto.check_warmup(self.budget, self.headroom, self.footprint)
        groups = optimizer.param_groups
        mixed = int(any(c.shard.dtype != torch.float32 for c in self.chunks if c.trainable))
        costs, names, shards = [], {}, []
        for c in self.chunks:
            if c.trainable and c.tier != "device":
                names[c.spec.index] = rule.state_names(groups[c.spec.group])
                n_states = len(names[c.spec.index])
                costs.append((c.spec.index, FLOAT * c.spec.shard_numel * (n_states + mixed)))
            if c.trainable and c.params_on_host:  # stage 3 ([Note: auto placement], 4.)
                shards.append((c.spec.index, c.spec.shard_numel * c.shard.element_size()))
        self.params_moved, self.moved = mo.auto.choose_with_params(shards, costs, self.room)
        moved_bytes = sum(b for k, b in shards if k in self.params_moved)
        moved_bytes += sum(b for k, b in costs if k in self.moved)
        if self.stage3 is not None:
            self.kept_bytes = max(0, self.room - moved_bytes)
            self.stage3.keep_bytes += self.kept_bytes
        by_index = {c.spec.index: c for c in self.chunks}
        for k in self.params_moved:
            by_index[k].params_to_device()
        for k in self.moved:
            by_index[k].to_device(names[k])
            self.offloader.tiers[self.plan_index[k]] = "device"


F = TypeVar("F", bound=Callable[..., Any])


def with_resident_states(fn: F) -> F:
    """For fn(zmodel, zopt, ...): NVMe-swapped optimizer states are in memory inside."""

    @functools.wraps(fn)
    def wrapper(zmodel: Any, zopt: Any, *args: Any, **kwargs: Any) -> Any:
        with resident_states(zopt):
            return fn(zmodel, zopt, *args, **kwargs)

    return wrapper  # type: ignore[return-value]
