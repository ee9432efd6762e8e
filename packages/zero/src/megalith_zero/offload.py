"""ZeRO-Offload: the bridge to megalith_offload, which decides per chunk where the fp32
master and the optimizer states live ("device", "host" or "nvme").

megalith_offload is optional: it is imported behind a guard here, and only a
ZeroConfig that asks for offloading needs it.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, TypeVar

import torch

from .config import ZeroConfig
from .layout import Layout
from .rule import Rule

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
    mixed = config.param_dtype != torch.float32
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
            )
        )
    # Pinned host memory only pays off (and only exists) beside a GPU.
    pinned = None if device.type == "cuda" else False
    return mo.Offloader(config.offload, costs, rank, pinned), index


def swapped_states(
    offloader: Any, chunks: list[tuple[FlatChunk, tuple[str, ...]]]
) -> Iterator[FlatChunk]:
    """Yields each NVMe chunk with its states (names given per chunk) read into host
    memory (`chunk.states`); written back when the caller moves on. The next chunk's
    read overlaps the caller's work on this one."""
    if not chunks:
        return
    stateless = [c for c, names in chunks if not names]
    yield from stateless
    by_key = {c.spec.index: c for c, names in chunks if names}
    for c, names in chunks:
        if names:
            c.ensure_states(names)
    for key, states in offloader.swap.stream(list(by_key)):
        c = by_key[key]
        c.states = states
        try:
            yield c
        finally:
            c.states = {}


@contextlib.contextmanager
def resident_states(zopt: Any) -> Iterator[None]:
    """Inside: every NVMe chunk's states are plain host tensors in `chunk.states` (for
    checkpoints, which read and write them directly); written back on a clean exit."""
    groups = zopt.optimizer.param_groups
    swapped = [c for c in zopt.chunks if c.tier == "nvme"]
    swapped = [c for c in swapped if zopt.rule.state_names(groups[c.spec.group])]
    for c in swapped:
        names = zopt.rule.state_names(groups[c.spec.group])
        c.ensure_states(names)
        c.states = {n: torch.empty(c.spec.shard_numel, dtype=torch.float32) for n in names}
        c.swap.load(c.spec.index, c.states)
    try:
        yield
        for c in swapped:
            c.swap.store(c.spec.index, c.states)
    finally:
        for c in swapped:
            c.states = {}


F = TypeVar("F", bound=Callable[..., Any])


def with_resident_states(fn: F) -> F:
    """For fn(zmodel, zopt, ...): NVMe-swapped optimizer states are in memory inside."""

    @functools.wraps(fn)
    def wrapper(zmodel: Any, zopt: Any, *args: Any, **kwargs: Any) -> Any:
        with resident_states(zopt):
            return fn(zmodel, zopt, *args, **kwargs)

    return wrapper  # type: ignore[return-value]
