"""ZeRO-Offload: the bridge to megalith_offload, which records per chunk where the fp32
master and the optimizer states live ("device", "host" or "nvme"), updates the host and
NVMe tiers' chunks, and with placement="auto" runs the warm-up that decides the
placement from a measured step (AutoPlacement; see [Note: auto placement] in
megalith_offload/auto.py). What stays here is what knows ZeRO's layout: the bytes each
chunk needs, and the model state no placement moves.

megalith_offload is optional: it is imported behind a guard here, and only a
ZeroConfig that asks for offloading needs it.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

import torch

from megalith_core.memory import StateMemory
from megalith_core.optim import flat_states
from megalith_core.optim.rules import Rule

from .config import ZeroConfig
from .layout import Layout
from .streams import Streams
from .tiers import DeviceTier, Tier

try:
    import megalith_offload
except ImportError:  # megalith_zero works without it; only offloading needs it
    megalith_offload = None

if TYPE_CHECKING:
    from megalith_offload import AutoPlacement, ChunkCost, Offloader

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
) -> Offloader | None:
    """The Offloader of the trainable chunks, keyed by chunk index; None without offload."""
    if config.offload is None:
        return None
    mo = require_offload()
    costs = chunk_costs(config, layout, optimizer, rule)
    # Pinned host memory only pays off (and only exists) beside a GPU.
    pinned = None if device.type == "cuda" else False
    return mo.Offloader(config.offload, costs, rank, pinned, warmup_param_frac(config))


def chunk_costs(
    config: ZeroConfig, layout: Layout, optimizer: torch.optim.Optimizer, rule: Rule
) -> dict[int, ChunkCost]:
    """megalith_offload.ChunkCost per trainable chunk index, in layout order: the bytes
    each chunk's training state takes on each tier."""
    mo = require_offload()
    mixed = config.param_dtype != torch.float32
    wd = torch.empty((), dtype=config.param_dtype).element_size()
    rd = torch.empty((), dtype=config.grad_reduce_dtype).element_size()
    costs = {}
    for spec in layout.chunks:
        if spec.group < 0:
            continue
        group = optimizer.param_groups[spec.group]
        names = rule.state_names(group)
        fmt = flat_states.group_format(rule, group)  # lean states: their real bytes
        s = spec.shard_numel
        states = flat_states.nbytes(names, fmt, s)
        costs[spec.index] = mo.ChunkCost(
            device=states + FLOAT * s * int(mixed),
            master=FLOAT * s,
            states=states,
            swap=mo.lean_file_bytes(names, s, fmt),
            step_staging=s * (wd + rd),
            params=s * wd,
        )
    return costs


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


def make_tiers(
    offloader: Offloader | None,
    chunks: list[FlatChunk],
    optimizer: torch.optim.Optimizer,
    rule: Rule,
    streams: Streams,
    memory: StateMemory,
    warming_up: bool,
) -> list[Tier]:
    """The tiers in the order ZeroOptimizer.step runs them: host chunks first (the host
    updates them while the device steps its own), then the device's, then NVMe's (one
    stream over every param group). Offloaded tiers' bytes join `memory`'s report."""
    device = DeviceTier(rule, streams, memory)
    if offloader is None:
        return [device]
    mo = require_offload()
    trainable = [c for c in chunks if c.trainable]
    groups = optimizer.param_groups
    names: list[str] = []
    for g in groups:
        names += [n for n in rule.state_names(g) if n not in names]

    def names_of(c: FlatChunk) -> tuple[str, ...]:
        return rule.state_names(groups[c.spec.group])

    host = mo.HostTier(offloader, trainable, rule, names_of, tuple(names), streams.step, warming_up)
    nvme = mo.NvmeTier(offloader, host)
    memory.join(host)
    memory.join(nvme)
    return [host, device, nvme]


def auto_placement(
    config: ZeroConfig,
    budget: int,
    memory: StateMemory,
    chunks: list[FlatChunk],
    offloader: Offloader,
    keep_gathered: Callable[[int], None] | None,
) -> AutoPlacement:
    """placement="auto"'s warm-up; at stage 3 the chunks prefetching holds from the
    second step on count, and keep_gathered is told the room the moves left."""
    ahead = 0
    if config.stage == 3:
        element = torch.empty((), dtype=config.param_dtype).element_size()
        ahead = config.prefetch * max(c.spec.numel for c in chunks) * element
    return require_offload().AutoPlacement(
        budget, config.offload.headroom, memory, chunks, offloader, ahead, keep_gathered
    )


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
    in_flight = max(in_flight, _bucket_in_flight(layout, stage) * rd)
    return params, grads, in_flight, gathered, one[0], one[1]


def _bucket_in_flight(layout: Layout, stage: int) -> int:
    """Elements in flight while the largest reduction bucket of one-parameter chunks
    (buckets.py) reduces: its rank-major packed copy and this rank's reduced slice, and
    at stages 2 and 3 every member's whole gradient, held until the bucket goes."""
    members: dict[int, list[int]] = {}
    for spec in layout.chunks:
        if spec.bucket >= 0 and spec.group >= 0:
            members.setdefault(spec.bucket, []).append(spec.numel)
    world = layout.chunks[0].world if layout.chunks else 1
    most = 0
    for numels in members.values():
        if len(numels) < 2:  # a bucket of one reduces as its chunk does
            continue
        full = sum(numels)
        most = max(most, full + full // world + (full if stage > 1 else 0))
    return most


F = TypeVar("F", bound=Callable[..., Any])


def with_resident_states(fn: F) -> F:
    """For fn(zmodel, zopt, ...): NVMe-swapped optimizer states are in memory inside."""

    @functools.wraps(fn)
    def wrapper(zmodel: Any, zopt: Any, *args: Any, **kwargs: Any) -> Any:
        with resident_states(zopt):
            return fn(zmodel, zopt, *args, **kwargs)

    return wrapper  # type: ignore[return-value]


def resident_states(zopt: Any) -> contextlib.AbstractContextManager[None]:
    """Inside: every NVMe chunk's states (and parameter shards kept in swap files) are
    plain host tensors (megalith_offload.resident_states); nothing to do without offload."""
    if zopt.offloader is None:
        return contextlib.nullcontext()
    groups = zopt.optimizer.param_groups
    return require_offload().resident_states(
        zopt.offloader, zopt.chunks, lambda c: zopt.rule.state_names(groups[c.spec.group])
    )
