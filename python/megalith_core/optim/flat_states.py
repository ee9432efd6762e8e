"""Optimizer states of flat shards (ZeRO's chunks, offloaded or not) in a lean format.

A chunk shard keeps each optimizer state as one flat vector of the shard's length.
With Adam's lean formats ([Note: lean states] in core/include/megalith/optim/slots.h,
chosen by the optimizer's ``state_dtype``, as megalith_core.optim.adam) the vectors
are:

    state_dtype  exp_avg            exp_avg_sq          scales (fp32, ceil(S / 256))
    "fp32"       fp32 S             fp32 S              -
    "bf16"       bf16 S             bf16 S              -
    "int8"       int8 S             uint8 S             exp_avg_scale, exp_avg_sq_scale

[Note: lean chunk states]
- q8 blocks are per shard: block b covers shard elements [256 b, 256 b + 256), so the
  block boundaries (and the values) depend on the layout (chunking and world size),
  not on which call steps the shard. A parameter that starts on a block boundary of
  the shard and whose length is a multiple of 256 (or that ends the shard) has the
  blocks a per-parameter optimizer gives it: there the chunk step equals CPUAdam's
  bit for bit.
- A piece of a shard (a step that skips unused parameters) that does not start on a
  block boundary is stepped on fp32 copies of the blocks it touches, which are then
  quantised again (the untouched elements of those blocks are re-encoded from their
  decoded values; the rule is idempotent up to the block scale's last bit).
- bf16's stochastic rounding draws from a stream per shard: the param group's seed
  mixed with the chunk's key and the rank (stream_seed), element index from the
  piece's start. Two shards never share random bits, and the bits depend only on the
  layout, not on how many shards one engine call steps (a per-parameter optimizer's
  streams are per parameter, so bf16 chunk states match CPUAdam's within the
  stochastic rounding: each state value is one of the two bf16 neighbours of the
  same fp32 value).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch

from . import lean_states
from .lean_states import Q8_BLOCK, SCALE_NAMES, blocks
from .rules import Rule

#: the states whose storage a lean format changes (the others stay fp32)
LEAN_NAMES = ("exp_avg", "exp_avg_sq")


def group_format(rule: Rule, group: Mapping[str, Any]) -> str:
    """The state format a param group asks for: its ``state_dtype`` for Adam, fp32 for
    every other rule (and for torch.optim's Adam, which has none)."""
    fmt = str(group.get("state_dtype", "fp32")) if rule.kind == "adam" else "fp32"
    lean_states.check_state_dtype("megalith: param group", fmt)
    if fmt != "fp32" and group.get("amsgrad"):
        raise ValueError(
            f"megalith: amsgrad needs fp32 states (the group has state_dtype={fmt!r}); "
            "pass state_dtype='fp32' or amsgrad=False"
        )
    return fmt


def stored_names(names: Iterable[str], state_dtype: str) -> tuple[str, ...]:
    """The vectors a shard keeps for the rule's states `names`: the int8 format adds
    the two block-scale vectors after them."""
    names = tuple(names)
    if state_dtype == "int8" and "exp_avg" in names:
        return (*names, *SCALE_NAMES)
    return names


def spec(name: str, state_dtype: str, numel: int) -> tuple[torch.dtype, int]:
    """(dtype, elements) of the vector `name` of a shard of `numel` elements."""
    if state_dtype == "bf16" and name in LEAN_NAMES:
        return torch.bfloat16, numel
    if state_dtype == "int8":
        if name == "exp_avg":
            return torch.int8, numel
        if name == "exp_avg_sq":
            return torch.uint8, numel
        if name in SCALE_NAMES:
            return torch.float32, blocks(numel)
    return torch.float32, numel


def specs(names: Iterable[str], state_dtype: str, numel: int) -> dict[str, tuple[torch.dtype, int]]:
    """spec() of every stored vector of the rule's states `names`."""
    return {n: spec(n, state_dtype, numel) for n in stored_names(names, state_dtype)}


def nbytes(names: Iterable[str], state_dtype: str, numel: int) -> int:
    """Bytes of a shard's optimizer states (the engine accounting counts the same)."""
    return sum(
        n * torch.empty((), dtype=d).element_size()
        for d, n in specs(names, state_dtype, numel).values()
    )


def allocate(
    zeros: Callable[[int, torch.dtype], torch.Tensor],
    names: Iterable[str],
    state_dtype: str,
    numel: int,
    into: dict[str, torch.Tensor],
) -> None:
    """Adds the missing stored vectors of `names` to `into`, from zeros(numel, dtype)."""
    for n, (dtype, count) in specs(names, state_dtype, numel).items():
        if n not in into:
            into[n] = zeros(count, dtype)


def format_of(states: Mapping[str, torch.Tensor]) -> str:
    """The format a shard's stored vectors hold (fp32 when it has no Adam states)."""
    if "exp_avg" not in states:
        return "fp32"
    return lean_states.format_of(dict(states))


def stream_seed(seed: int, key: int, rank: int) -> int:
    """The bf16 rounding stream of chunk `key`'s shard on `rank` (see the Note):
    splitmix64 of the pair, xor the group's seed."""
    z = (key * 0x9E3779B97F4A7C15 + rank * 0xD1B54A32D192ED03 + 0x632BE59BD9B4E019) % 2**64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) % 2**64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) % 2**64
    return (int(seed) ^ z ^ (z >> 31)) % 2**64


def block_aligned(sl: slice, numel: int) -> bool:
    """Shard range `sl` starts on a q8 block and ends on one or at the shard's end."""
    return sl.start % Q8_BLOCK == 0 and (sl.stop % Q8_BLOCK == 0 or sl.stop == numel)


def block_range(sl: slice, numel: int) -> slice:
    """The whole q8 blocks covering shard range `sl`."""
    return slice(sl.start // Q8_BLOCK * Q8_BLOCK, min(-(-sl.stop // Q8_BLOCK) * Q8_BLOCK, numel))


def piece(states: Mapping[str, torch.Tensor], sl: slice) -> dict[str, torch.Tensor]:
    """The stored vectors of shard range `sl` (q8 scales by block: `sl` must start on
    a block boundary, and end on one or at the shard's end)."""
    out = {}
    for n, t in states.items():
        if n in SCALE_NAMES:
            out[n] = t[sl.start // Q8_BLOCK : -(-sl.stop // Q8_BLOCK)]
        else:
            out[n] = t[sl]
    return out


def to_fp32(states: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The shard's states as fp32 vectors under the rule's names (scales folded in)."""
    out = {n: t for n, t in states.items() if n not in SCALE_NAMES}
    if "exp_avg" in states:
        m, v = lean_states.to_fp32(dict(states))
        out["exp_avg"], out["exp_avg_sq"] = m, v
    return {n: t if t.dtype == torch.float32 else t.float() for n, t in out.items()}


def write_fp32(states: dict[str, torch.Tensor], values: Mapping[str, torch.Tensor]) -> None:
    """Stores fp32 `values` (the rule's names, whole shard) into the shard's vectors in
    their format: q8 quantised (block scales recomputed), bf16 rounded to nearest."""
    fmt = format_of(states)
    if fmt == "int8" and "exp_avg" in values:
        q = lean_states.quantize(values["exp_avg"], values["exp_avg_sq"])
        for n, t in q.items():
            states[n].copy_(t)
        values = {n: t for n, t in values.items() if n not in LEAN_NAMES}
    for n, t in values.items():
        states[n].copy_(t)


def apply(
    rule: Rule,
    group: dict[str, Any],
    step: int,
    master: torch.Tensor,
    grad: torch.Tensor,
    states: Mapping[str, torch.Tensor],
    copy: torch.Tensor | None,
    grad_scale: float,
    sl: slice,
    seed: int,
) -> None:
    """One engine call on shard range `sl` of a shard whose states are lean (see the
    Note); master, grad and copy are whole-shard vectors, `seed` its stream_seed."""
    numel = master.numel()
    g = dict(group, seed=seed)
    copies = None if copy is None else [copy[sl]]
    if format_of(states) != "int8" or block_aligned(sl, numel):
        part = piece(states, sl)
        rule.apply(
            g, step, [master[sl]], [grad[sl]], {n: [t] for n, t in part.items()}, copies, grad_scale
        )
        return
    # q8 piece off the block grid: its blocks in fp32, stepped, then quantised again
    wide = block_range(sl, numel)
    held = piece(states, wide)
    fp32 = to_fp32(held)
    inner = slice(sl.start - wide.start, sl.stop - wide.start)
    rule.apply(
        g,
        step,
        [master[sl]],
        [grad[sl]],
        {n: [t[inner]] for n, t in fp32.items()},
        copies,
        grad_scale,
    )
    write_fp32(held, fp32)
