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

A bare `loss.backward()` (not booster.backward) passes through no Python frame of ours,
so the gradient all_reduce goes through a DDP communication hook (`install_hook`, see
[Note: the diagnosing comm hook]).
"""

from __future__ import annotations

import contextlib
import functools
import threading
import time
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist

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
    """Counts a backward that will all-reduce gradients (not under no_sync) on the world group
    (the comm hook counts for itself when it is installed)."""
    if getattr(ddp, "require_backward_grad_sync", False) and not hasattr(ddp, _HOOK_ATTR):
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


# [Note: the diagnosing comm hook]
# The hook all-reduces each bucket as torch's default does (scaled by 1/world first, then
# summed: the same arithmetic as the built-in hook, so the values are bit-equal), and
# chains a callback on torch's future that turns a transport failure into the CommError
# of health.diagnose (on the Gloo worker thread that completes the future). Raised there,
# torch would hand it on as a RuntimeError holding only its text, so the last bucket's
# hook also queues an autograd final callback: the reducer's own finalize is queued after
# it (when the last bucket is ready), so ours runs first, waits for this backward's
# buckets (which finalize would wait for anyway) and raises the CommError itself, which
# the autograd engine passes to the caller of backward() unchanged. A hook the user
# registers with ddp.register_comm_hook runs inside ours, keeping the diagnosis.
_HOOK_ATTR = "_megalith_diagnosis"


class _HookState:
    """What the comm hook keeps between its calls."""

    def __init__(self, process_group: Any):
        self.process_group = process_group
        self.scale = 1.0 / dist.get_world_size(process_group)
        self.user_hook: Any = None
        self.user_state: Any = None
        self.futures: list[torch.futures.Future] = []
        self.failure: BaseException | None = None
        self._lock = threading.Lock()

    def settled(self, what: str, unwrap: bool, fut: torch.futures.Future) -> torch.Tensor:
        """The then-callback: the reduced bucket, or the diagnosed CommError."""
        try:
            value = fut.value()
        except RuntimeError as exc:
            failure = self.diagnose(what, exc)
            raise failure  # noqa: B904 (its cause is set: torch's error)
        return value[0] if unwrap else value

    def diagnose(self, what: str, exc: BaseException) -> BaseException:
        """The CommError naming the rank behind `exc` (found once per failure)."""
        from megalith_comm import health

        with self._lock:
            if self.failure is None:
                world = _world()
                if world is None or not _is_transport_failure(exc):
                    self.failure = exc
                else:
                    world.blocked = None  # diagnosing: the watchdog must let it finish
                    self.failure = health.diagnose(world, what, exc, world.group)
                    self.failure.__cause__ = exc
            return self.failure

    def check(self) -> None:
        """The autograd final callback: waits for this backward's buckets; raises the
        CommError of a failed one before DDP's finalize sees torch's error."""
        futures, self.futures = self.futures, []
        world = _world()
        if world is not None:
            world.blocked = (BACKWARD, time.monotonic())
        try:
            for fut in futures:
                try:
                    fut.wait()
                except RuntimeError as exc:
                    failure = self.failure or self.diagnose(BACKWARD, exc)
                    raise failure  # noqa: B904 (its cause is set: torch's error)
        finally:
            if world is not None:
                world.blocked = None


def _diagnosing_hook(state, bucket):  # unannotated: DDP refuses string annotations
    index = bucket.index()
    if index == 0:  # the first bucket of a synchronising backward (they run in order)
        world = _world()
        if world is not None:
            world.group.issued += 1
        state.futures.clear()
    what = f"{BACKWARD} (bucket {index}, {bucket.buffer().numel():,} values)"
    if state.user_hook is not None:
        fut, unwrap = state.user_hook(state.user_state, bucket), False
    else:
        buffer = bucket.buffer()
        buffer.mul_(state.scale)
        try:
            work = dist.all_reduce(buffer, group=state.process_group, async_op=True)
        except RuntimeError as exc:
            failure = state.diagnose(what, exc)
            raise failure  # noqa: B904 (its cause is set: torch's error)
        fut, unwrap = work.get_future(), True
    fut = fut.then(functools.partial(state.settled, what, unwrap))
    state.futures.append(fut)
    if bucket.is_last():
        with contextlib.suppress(RuntimeError):  # outside a backward: the callback's text
            torch.autograd.Variable._execution_engine.queue_callback(state.check)
    return fut


def install_hook(ddp: torch.nn.parallel.DistributedDataParallel) -> None:
    """Runs DDP's gradient all_reduce through the diagnosing hook; a hook the user registers
    later with ddp.register_comm_hook runs inside it."""
    state = _HookState(ddp.process_group)
    ddp.register_comm_hook(state, _diagnosing_hook)

    def register_comm_hook(user_state: object, hook: Any) -> None:
        if not callable(hook):
            raise TypeError(f"register_comm_hook: hook must be callable, got {hook!r}")
        state.user_hook, state.user_state = hook, user_state

    setattr(ddp, _HOOK_ATTR, state)
    ddp.register_comm_hook = register_comm_hook  # type: ignore[method-assign]
