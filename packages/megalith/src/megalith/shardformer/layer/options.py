"""The arguments ColossalAI's layers share: sequence-parallel mode, fp8, initializers,
and the performance-only extras (warned once each, as the rest of megalith does)."""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from typing import Any

import torch

_warned: set[str] = set()

# Modes in which the linear layers themselves split or gather the sequence over the
# tensor-parallel group; the others ("all_to_all", "ring_attn") act in attention only.
_SHARES_TP = ("split_gather", "ring")
_MODES = (None, *_SHARES_TP, "all_to_all", "ring_attn")


def warn_once(key: str, message: str) -> None:
    if key not in _warned:
        _warned.add(key)
        warnings.warn(message, stacklevel=3)


def sequence_shares_tp(mode: str | None, what: str) -> bool:
    """Whether this seq_parallel_mode makes the linear all-gather / reduce-scatter the sequence."""
    if mode not in _MODES:
        raise ValueError(f"{what}: seq_parallel_mode={mode!r}; use one of {list(_MODES)}")
    if mode == "ring":
        warn_once("ring", f"{what}: seq_parallel_mode='ring' runs as 'split_gather' (same values)")
    return mode in _SHARES_TP


def check_common(what: str, fp8_communication: bool, use_zbv: bool, extra: dict[str, Any]) -> None:
    if fp8_communication:
        raise ValueError(
            f"{what}: fp8_communication=True changes the results and megalith does not "
            "have it; leave it False (use bf16 precision to save bandwidth)"
        )
    if use_zbv:
        warn_once("use_zbv", f"{what}: use_zbv is ignored (performance only)")
    for name in extra:
        warn_once(f"kw:{name}", f"{what}: argument {name!r} is ignored (performance only)")


def initialize(
    t: torch.Tensor, fan_in: int, fan_out: int, initializer: Callable | None, default: str
) -> None:
    """ColossalAI's initializer call (tensor, fan_in=, fan_out=), or torch's default for
    the layer kind: "linear" (kaiming uniform, a=sqrt(5)), "bias" (uniform 1/sqrt(fan_in)),
    "embedding" (normal)."""
    with torch.no_grad():
        if initializer is not None:
            initializer(t, fan_in=fan_in, fan_out=fan_out)
        elif default == "embedding":
            t.normal_()
        else:
            bound = 1.0 / math.sqrt(fan_in) if fan_in > 0 else 0.0
            t.uniform_(-bound, bound)
