"""Debug mode (MEGALITH_COMM_DEBUG=1): every rank checks that its group agrees before a collective.

Before each collective, the ranks of the group all-gather (over Gloo) a small int64
signature: the op, dtype, device type, reduce op, root, shape (or per-rank sizes for
the list forms, or split sizes for all_to_all).
If the signatures differ, every rank raises the same CollectiveMismatchError naming
the ranks that differ from the majority and what each called, e.g.

    rank 1 called all_reduce(shape [4], float32, op sum) but rank 0 called
    all_reduce(shape [8], float32, op sum)

It costs one small Gloo all-gather per collective: cheap enough to leave on in tests.
With debug mode off, the always-on check of mismatch.py runs instead (see
[Note: the always-on mismatch check]).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import torch

from .errors import CollectiveMismatchError
from .handle import launch, retire

OPS = ("barrier", "all_reduce", "reduce_scatter", "all_gather", "broadcast", "reduce", "all_to_all")
REDUCE_OPS = ("sum", "avg", "min", "max", "prod")
DTYPES = (
    torch.float32,
    torch.float64,
    torch.float16,
    torch.bfloat16,
    torch.int64,
    torch.int32,
    torch.int16,
    torch.int8,
    torch.uint8,
    torch.bool,
    torch.complex64,
    torch.complex128,
)
DEVICES = ("cpu", "cuda")
MAGIC = 0x4D47
MAX_DIMS = 8
HEADER = 18  # magic, reserved, op, dtype, device, redop, root, ndim, 8 dims, numel, n_sizes
LABEL = "MEGALITH_COMM_DEBUG=1"


def enabled() -> bool:
    """True when MEGALITH_COMM_DEBUG is set to 1/true/yes/on (read at each call)."""
    return os.environ.get("MEGALITH_COMM_DEBUG", "").strip().lower() in ("1", "true", "yes", "on")


def encode(
    group_size: int,
    op: str,
    dtype: torch.dtype | None = None,
    device: str = "cpu",
    redop: str | None = None,
    root: int = -1,
    shape: Sequence[int] | None = None,
    numel: int = -1,
    sizes: Sequence[int] | None = None,
    splits: tuple[Sequence[int], Sequence[int]] | None = None,
) -> torch.Tensor:
    """The signature as int64[HEADER + 2 * group_size] (same length on every rank)."""
    sig = torch.full((HEADER + 2 * group_size,), -1, dtype=torch.int64)
    sig[0], sig[1], sig[2] = MAGIC, 0, OPS.index(op)  # sig[1]: reserved
    sig[3] = DTYPES.index(dtype) if dtype in DTYPES else (len(DTYPES) if dtype else -1)
    sig[4] = DEVICES.index(device) if device in DEVICES else len(DEVICES)
    sig[5] = REDUCE_OPS.index(redop) if redop else -1
    sig[6] = root
    if shape is not None:
        dims = list(shape)
        if len(dims) > MAX_DIMS:  # fold the tail: only equality matters past 8 dims
            tail = 1
            for d in dims[MAX_DIMS - 1 :]:
                tail *= d
            dims = [*dims[: MAX_DIMS - 1], tail]
        sig[7] = len(shape)
        sig[8 : 8 + len(dims)] = torch.tensor(dims, dtype=torch.int64)
    sig[16] = numel
    if sizes is not None:
        sig[17] = 1
        sig[HEADER : HEADER + group_size] = torch.tensor(list(sizes), dtype=torch.int64)
    elif splits is not None:
        sig[17] = 2
        sig[HEADER : HEADER + group_size] = torch.tensor(list(splits[0]), dtype=torch.int64)
        sig[HEADER + group_size :] = torch.tensor(list(splits[1]), dtype=torch.int64)
    return sig


def describe(sig: list[int], group_size: int) -> str:
    """A signature as text: all_reduce(shape [4], float32, op sum)."""
    if sig[0] != MAGIC:
        return "something that is not a megalith_comm collective (no debug signature)"
    op = OPS[sig[2]]
    parts = []
    if sig[7] >= 0:
        label = "row shape [*, " if op == "all_to_all" else "shape ["
        parts.append(label + ", ".join(str(d) for d in sig[8 : 8 + min(sig[7], MAX_DIMS)]) + "]")
    if sig[17] == 1:
        parts.append("sizes [" + ", ".join(map(str, sig[HEADER : HEADER + group_size])) + "]")
    if sig[17] == 2 and len(sig) > HEADER:
        parts.append("send rows [" + ", ".join(map(str, sig[HEADER : HEADER + group_size])) + "]")
        parts.append("recv rows [" + ", ".join(map(str, sig[HEADER + group_size :])) + "]")
    if sig[16] >= 0:
        parts.append(f"output numel {sig[16]}")
    if sig[3] >= 0:
        parts.append(
            str(DTYPES[sig[3]]).replace("torch.", "") if sig[3] < len(DTYPES) else "dtype?"
        )
    if sig[4] != 0:
        parts.append(DEVICES[sig[4]] if sig[4] < len(DEVICES) else "device?")
    if sig[5] >= 0:
        parts.append(f"op {REDUCE_OPS[sig[5]]}")
    if sig[6] >= 0:
        parts.append(f"{'dst' if op == 'reduce' else 'src'} {sig[6]}")
    return f"{op}({', '.join(parts)})"


def _ranks_text(ranks: Sequence[int]) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, ranks))


def mismatch_message(
    group_name: str, ranks: Sequence[int], sigs: list[list[int]], label: str = LABEL
) -> tuple[str, tuple[int, ...]] | None:
    """None when all signatures agree; else (text naming who called what, differing ranks).
    label: what found it, in parentheses after the group."""
    size = len(ranks)
    classes: dict[tuple[int, ...], list[int]] = {}
    for r, sig in zip(ranks, sigs):
        # all_to_all's split sizes differ per rank by design: they are cross-checked below.
        key = sig[:HEADER] if sig[17] == 2 else sig
        classes.setdefault(tuple(key), []).append(r)
    if len(classes) > 1:
        ref_sig, ref_ranks = max(classes.items(), key=lambda kv: (len(kv[1]), -kv[1][0]))
        others = [
            f"{_ranks_text(rs)} called {describe(list(s), size)}"
            for s, rs in sorted(classes.items(), key=lambda kv: kv[1][0])
            if s != ref_sig
        ]
        text = (
            f"collective mismatch in group {group_name!r} ({label}): "
            + "; ".join(others)
            + f" but {_ranks_text(ref_ranks)} called {describe(list(ref_sig), size)}"
        )
        return text, tuple(r for r in ranks if r not in ref_ranks)
    if sigs[0][17] == 2:  # all_to_all with splits: what i sends to j, j must expect from i
        bad, who = [], set()
        for i in range(size):
            for j in range(size):
                sent = sigs[i][HEADER + j]
                expected = sigs[j][HEADER + size + i]
                if sent != expected:
                    who.update((ranks[i], ranks[j]))
                    bad.append(
                        f"rank {ranks[i]} sends {sent} rows to rank {ranks[j]}, which expects "
                        f"{expected} rows from it"
                    )
        if bad:
            text = (
                f"all_to_all split sizes disagree in group {group_name!r} "
                f"({label}): " + "; ".join(bad[:8])
            )
            return text, tuple(sorted(who))
    return None


def check(group: Any, op: str, **fields: Any) -> None:
    """Counts the collective on the group and verifies that the group agrees on it, raising the
    same error on every rank: in full in debug mode, else by the always-on check (mismatch.py)."""
    position = group.issued
    group.issued += 1
    if group.size == 1:
        return
    if not enabled():
        from .mismatch import check as cheap_check  # it builds on this module

        cheap_check(group, position, op, fields)
        return
    import torch.distributed as dist

    sig = encode(group.size, op, **fields)
    gathered = torch.empty(group.size * sig.numel(), dtype=torch.int64)
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    launch(group, f"{op} (debug signature check)", lambda: gather(gathered, sig, group=group.gloo))
    retire((sig, gathered))  # see [Note: Gloo works outlive their wait]
    sigs = gathered.view(group.size, -1).tolist()
    found = mismatch_message(group.name, group.ranks, sigs)
    if found is not None:
        raise CollectiveMismatchError(found[0], ranks=found[1])
