"""Full (unsharded) parameters, gathered one chunk at a time.

Never more than one chunk's worth of gathered fp32 values exists at once: the
caller consumes (or writes out) each chunk's parameters before the next chunk is
gathered, so saving a model far larger than one rank's memory works.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import torch

import megalith_comm as comm

from .chunk import FlatChunk


def gathered_chunk(chunk: FlatChunk, group: comm.ProcessGroup) -> torch.Tensor:
    """The chunk's full fp32 values (trainable: the master; frozen: the working params)."""
    src = chunk.master_values() if chunk.trainable else chunk.shard
    src = src.to(
        chunk.full.device
    )  # offloaded masters (and params) are on the host: gather where comm is
    out = torch.empty(chunk.spec.numel, dtype=src.dtype, device=src.device)
    comm.all_gather(out, src.contiguous(), group=group)
    return out if out.dtype == torch.float32 else out.float()


def iter_full_params(
    chunks: list[FlatChunk], group: comm.ProcessGroup
) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, fp32 tensor) for every parameter, in chunk order; every rank of the
    group must consume it in step (each chunk is one all-gather)."""
    for c in chunks:
        flat = gathered_chunk(c, group)
        for s in c.spec.slots:
            yield s.name, flat[s.offset : s.offset + s.numel].view(s.shape).clone()


#: bytes of each rank's error text exchanged by agree_written
_ERROR_BYTES = 1024


def agree_written(group: comm.ProcessGroup, error: BaseException | None) -> None:
    """Collective over group, right after a save's local writes: every rank learns at once
    whether any rank's writes failed (a full disk on the writer), instead of waiting in
    the save's next collective until the timeout. The failed rank re-raises its own error
    (it names the file); the others raise one naming that rank and its error."""
    device = comm.get_world().device
    text = b"" if error is None else f"{type(error).__name__}: {error}".encode()[:_ERROR_BYTES]
    mine = torch.zeros(_ERROR_BYTES, dtype=torch.uint8)
    mine[: len(text)] = torch.frombuffer(bytearray(text), dtype=torch.uint8) if text else 0
    every = torch.empty(group.size * _ERROR_BYTES, dtype=torch.uint8, device=device)
    comm.all_gather(every, mine.to(device), group=group)
    if error is not None:
        raise error
    rows = every.cpu().view(group.size, _ERROR_BYTES)
    for rank, row in enumerate(rows):
        if row.any():
            said = bytes(row.tolist()).rstrip(b"\0").decode(errors="replace")
            raise RuntimeError(
                f"the checkpoint save failed on rank {rank} of group {group.name!r}: {said}"
            )


def keep_formats(zopt: Any, restore: Callable[[], None]) -> None:
    """Runs restore() (saved hyperparameters into the live param groups) keeping each
    group's state_dtype: the chunks keep the format they were built with."""
    kept = [g.get("state_dtype") for g in zopt.optimizer.param_groups]
    restore()
    for g, fmt in zip(zopt.optimizer.param_groups, kept):
        if fmt is None:
            g.pop("state_dtype", None)
        else:
            g["state_dtype"] = fmt
