"""What the pure-torch optimizers of megalith.nn.optimizer share: argument checks,
one-time warnings for ignored arguments, and the refusal of tensor-parallel shards
(their updates use per-tensor norms, which a shard alone cannot give)."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable
from typing import Any

import torch

ParamsT = Iterable[torch.Tensor] | Iterable[dict[str, Any]]

_warned: set[tuple[str, str]] = set()


def warn_ignored(owner: str, argument: str, why: str) -> None:
    """warnings.warn once per (owner, argument)."""
    if (owner, argument) in _warned:
        return
    _warned.add((owner, argument))
    warnings.warn(f"{owner}: {argument} is ignored: {why}", UserWarning, stacklevel=3)


def is_sharded(p: torch.Tensor) -> bool:
    """A tensor-parallel shard: megalith's (carries `tp_spec`) or a torch DTensor."""
    if getattr(p, "tp_spec", None) is not None:
        return True
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # torch built without distributed
        return False
    return isinstance(p, DTensor)


def refuse_shard(owner: str, p: torch.Tensor, index: int) -> None:
    if is_sharded(p):
        raise NotImplementedError(
            f"{owner}: parameter {index} (shape {list(p.shape)}) is a tensor-parallel shard; "
            f"{owner}'s update uses norms of the whole tensor, which megalith does not gather "
            "across tensor-parallel ranks. Use tp_size=1 with this optimizer, or an "
            "elementwise optimizer (HybridAdam, FusedSGD, torch.optim.AdamW) with tensor "
            "parallelism."
        )


def check_betas(owner: str, betas: tuple[float, ...]) -> tuple[float, ...]:
    for i, b in enumerate(betas):
        if not 0.0 <= b < 1.0:
            raise ValueError(f"{owner}: invalid beta{i + 1} {b}; expected 0 <= beta < 1")
    return tuple(betas)


def check_nonnegative(owner: str, **values: float) -> None:
    for name, v in values.items():
        if v < 0.0:
            raise ValueError(f"{owner}: invalid {name} {v}; expected >= 0")


def run_closure(closure: Callable[[], Any] | None) -> Any:
    if closure is None:
        return None
    with torch.enable_grad():
        return closure()


def params_with_grads(
    optimizer: torch.optim.Optimizer,
) -> Iterable[tuple[dict[str, Any], int, torch.Tensor]]:
    """(group, index, param) for every parameter that has a gradient, refusing
    sparse gradients and tensor-parallel shards."""
    owner = type(optimizer).__name__
    index = -1
    for group in optimizer.param_groups:
        for p in group["params"]:
            index += 1
            if p.grad is None:
                continue
            if p.grad.is_sparse:
                raise ValueError(f"{owner}: parameter {index} has a sparse gradient; not supported")
            refuse_shard(owner, p, index)
            yield group, index, p


def next_step(state: dict[str, Any]) -> int:
    """Adds one to state['step'] (torch's layout: a float32 scalar tensor; an int
    from a ColossalAI checkpoint is kept an int) and returns the new count."""
    if "step" not in state:
        state["step"] = torch.tensor(0.0, dtype=torch.float32)
    if isinstance(state["step"], torch.Tensor):
        state["step"] += 1
        return int(state["step"].item())
    state["step"] += 1
    return int(state["step"])


def rms(t: torch.Tensor) -> torch.Tensor:
    """Root mean square of all elements."""
    return t.norm(2) / (t.numel() ** 0.5)
