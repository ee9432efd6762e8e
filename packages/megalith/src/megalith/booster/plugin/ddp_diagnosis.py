"""Naming the rank behind a failure of torch DDP's own collectives, as megalith_comm does.

torch's DistributedDataParallel runs its collectives (the parameter broadcast when it is
built, buffer broadcasts in forward, the gradient all_reduce in backward) on the world's
Gloo group itself, past megalith_comm. When a peer dies or hangs there, torch raises
Gloo's socket error ("Connection reset by peer [127.0.0.1]:50860") or a timeout, naming no
rank. `diagnosed(what)` turns such an error into megalith_comm's CommError, whose
diagnosis asks the store which ranks reported a failure, which stopped beating, and which
are behind (health.diagnose). For the last, every gradient synchronisation counts as one
collective on the world group (`count_sync`): a rank stuck before its backward has
issued fewer, and is named with the counts.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

BUILD = "DistributedDataParallel's parameter broadcast from rank 0 (building the model)"
FORWARD = "DistributedDataParallel's forward (buffer broadcast from rank 0)"
BACKWARD = "DistributedDataParallel's gradient all_reduce in backward"
#: words of torch.distributed's transport errors (Gloo, NCCL, the store), as opposed to
#: the RuntimeErrors of the model's own code, which pass through unchanged
_TRANSPORT_WORDS = ("gloo", "nccl", "connection", "timed out", "timeout", "peer", "socket")


def _is_transport_failure(exc: RuntimeError) -> bool:
    dist_error = getattr(torch.distributed, "DistError", None)
    if dist_error is not None and isinstance(exc, dist_error):
        return True
    text = str(exc).lower()
    return any(word in text for word in _TRANSPORT_WORDS)


def _world() -> Any:
    import megalith_comm as comm

    return comm.get_world() if comm.is_initialized() else None


@contextlib.contextmanager
def diagnosed(what: str) -> Iterator[None]:
    """Re-raises a transport failure inside the block as a CommError naming the rank behind
    it; other errors pass through unchanged."""
    try:
        yield
    except RuntimeError as exc:
        from megalith_comm import CommError, health

        world = _world()
        if isinstance(exc, CommError) or world is None or world.world_size == 1:
            raise
        if not _is_transport_failure(exc):
            raise
        raise health.diagnose(world, f"{what} on group 'world'", exc, world.group) from exc


def count_sync(ddp: torch.nn.Module) -> None:
    """Counts a backward that will all-reduce gradients (not under no_sync) on the world group."""
    if getattr(ddp, "require_backward_grad_sync", False):
        world = _world()
        if world is not None:
            world.group.issued += 1


def refuse_meta(model: torch.nn.Module) -> None:
    """A model with meta tensors has no values for DDP to broadcast: say how to get them."""
    meta = [n for n, t in [*model.named_parameters(), *model.named_buffers()] if t.is_meta]
    if not meta:
        return
    names = ", ".join(meta[:4]) + (f" and {len(meta) - 4} more" if len(meta) > 4 else "")
    raise ValueError(
        f"TorchDDPPlugin: the model has parameters on the meta device ({names}): they hold "
        "no values, so DistributedDataParallel cannot broadcast rank 0's weights. Give them "
        "storage and values before boost(): model.to_empty(device=...) then initialise them "
        "(reset_parameters() on each layer, or load a checkpoint), or build the model under "
        "megalith.lazy.LazyInitContext(), which boost() materialises itself."
    )
