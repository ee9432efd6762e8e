"""The always-on mismatch check: ranks that disagree on a collective fail with the cause named.

[Note: the always-on mismatch check]
Without a check, a collective whose shape or dtype differs between ranks aborts the
receiving rank inside Gloo (SIGABRT, "Received data size doesn't match expected
size"), and one whose reduce op differs returns wrong values silently. Debug mode
(debug.py) exchanges a full signature before every collective; this check is what
runs when debug mode is off, and costs far less:
- every collective folds its key (op, dtype, device, reduce op, root, shape, sizes,
  group) into a running 64-bit digest of the group's history, on the host;
- before some collectives the ranks all-gather (over the group's Gloo group) four
  int64: a marker, the group's position (collectives issued on it), the digest and
  the group's name hash. Equal rows: the histories agree. Otherwise every rank has
  the same rows, so every rank swaps its last HISTORY keys, finds the first
  position where they differ, and raises the same CollectiveMismatchError.
Which collectives exchange: every one that goes over Gloo (CPU tensors, barrier),
because there a mismatch aborts the process before anything could be said; a key
this rank has not seen on the group before (the first collective of each kind and
shape); and every `every`-th (MEGALITH_COMM_CHECK_EVERY, default 16). The choice
may differ between ranks only where their histories already differ, and is safe
then too: Gloo pairs collectives by order, and since a rank issues nothing over
Gloo without an exchange first, the next exchange of each rank meets the other's.
On CUDA a mismatch between two exchanges runs in NCCL (wrong values or a stall, no
abort) and is named at the next one.
"""

from __future__ import annotations

import collections
import os
import zlib
from typing import Any

import torch

from . import debug
from .errors import CollectiveMismatchError
from .handle import Handle, launch, retire

DEFAULT_EVERY = 16
HISTORY = 64  # keys kept per group to name the first difference (>= every, see exchange)
MAX_SEEN = 4096  # distinct keys remembered per group; past that, only the period applies
MARK = 0x4D43  # a row from this check (rows from anything else have no mark)
_DTYPE = {d: i for i, d in enumerate(debug.DTYPES)}
_MASK = (1 << 63) - 1


def every_from_env() -> int:
    """MEGALITH_COMM_CHECK_EVERY: exchange at least every N-th collective (N >= 1)."""
    raw = os.environ.get("MEGALITH_COMM_CHECK_EVERY", "").strip()
    if not raw:
        return DEFAULT_EVERY
    try:
        every = int(raw)
    except ValueError:
        every = 0
    if not 1 <= every <= HISTORY:
        raise ValueError(
            f"MEGALITH_COMM_CHECK_EVERY={raw!r}: expected a whole number from 1 to {HISTORY} "
            f"(exchange the mismatch check at least every N-th collective; default "
            f"{DEFAULT_EVERY}). MEGALITH_COMM_DEBUG=1 checks every collective in full."
        )
    return every


def _key(op: str, fields: dict[str, Any]) -> tuple:
    """The ints that must agree across ranks (None would hash by address: -1 instead)."""
    dtype = fields.get("dtype")
    shape = fields.get("shape")
    sizes = fields.get("sizes")
    splits = fields.get("splits")
    return (
        debug.OPS.index(op),
        _DTYPE.get(dtype, -1 if dtype is None else len(_DTYPE)),
        0 if fields.get("device", "cpu") == "cpu" else 1,
        debug.REDUCE_OPS.index(fields["redop"]) if fields.get("redop") else -1,
        int(fields.get("root", -1)),
        tuple(shape) if shape is not None else (-1,),
        int(fields.get("numel", -1)),
        tuple(sizes) if sizes is not None else (-1,),
        # all_to_all's split sizes differ per rank by design; debug mode cross-checks them
        -1 if splits is None else 2,
    )


class Agreement:
    """One group's side of the check: its digest, the keys it has seen, its recent history."""

    def __init__(self, name: str, every: int | None = None):
        self.every = every_from_env() if every is None else every
        self.name_hash = zlib.crc32(name.encode())
        self.digest = self.name_hash
        self.seen: set[tuple] = set()
        self.recent: collections.deque[tuple[int, str, dict[str, Any]]] = collections.deque(
            maxlen=HISTORY
        )
        self.exchanges = 0  # how many exchanges ran (tests and benchmarks read it)

    def note(self, position: int, op: str, fields: dict[str, Any]) -> bool:
        """Folds the collective at `position` into the digest; True when it must exchange."""
        key = _key(op, fields)
        self.digest = hash((self.digest, key)) & _MASK
        self.recent.append((position, op, fields))
        over_gloo = op == "barrier" or fields.get("device", "cpu") == "cpu"
        new = key not in self.seen
        if new and len(self.seen) < MAX_SEEN:
            self.seen.add(key)
        return over_gloo or new or position % self.every == 0


def check(group: Any, position: int, op: str, fields: dict[str, Any]) -> None:
    """The cheap check for the collective `op` at `position` on `group` (debug mode off)."""
    agreement = group.agreement
    if not agreement.note(position, op, fields):
        return
    agreement.exchanges += 1
    import torch.distributed as dist

    row = torch.tensor([MARK, position, agreement.digest, agreement.name_hash], dtype=torch.int64)
    rows = torch.empty(group.size * 4, dtype=torch.int64)
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    shape = fields.get("shape")
    what = f"{op}{'' if shape is None else f'(shape {list(shape)})'} on group {group.name!r}"
    _exchange(
        group,
        f"{what} (its mismatch check)",
        lambda: gather(rows, row, group=group.gloo, async_op=True),
    )
    retire((row, rows))  # see [Note: Gloo works outlive their wait]
    table = rows.view(group.size, 4).tolist()
    if any(r != table[0] for r in table[1:]):
        text, ranks = _name_difference(group, table)
        # Every rank raises here: start again from one state, so that the group can go on.
        agreement.digest = agreement.name_hash
        agreement.recent.clear()
        raise CollectiveMismatchError(text, ranks=ranks)


def _exchange(group: Any, what: str, start: Any) -> None:
    """Runs the all-gather as a collective's Handle does: while it waits, the watchdog knows
    this rank is blocked (a peer's failure then ends it at once, [Note: the watchdog])."""
    Handle(group, what, [launch(group, what, start)]).wait()


def _name_difference(group: Any, table: list[list[int]]) -> tuple[str, tuple[int, ...]]:
    """Every rank swaps its recent keys (encoded as debug signatures) and names the first
    position at which they differ."""
    import torch.distributed as dist

    ranks, size = group.ranks, group.size
    strangers = [ranks[i] for i, r in enumerate(table) if r[0] != MARK]
    if strangers:
        return (
            f"collective mismatch on group {group.name!r}: rank(s) {strangers} were not in a "
            "megalith_comm collective when the others checked theirs (a torch.distributed call "
            "on the same group on some ranks only?)",
            tuple(strangers),
        )
    width = 1 + debug.HEADER + 2 * size
    mine = torch.full((HISTORY, width), -1, dtype=torch.int64)
    for i, (position, op, fields) in enumerate(group.agreement.recent):
        mine[i, 0] = position
        mine[i, 1:] = debug.encode(size, op, **fields)
    everyone = torch.empty(size * HISTORY * width, dtype=torch.int64)
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    _exchange(
        group,
        "mismatch check (history)",
        lambda: gather(everyone, mine.view(-1), group=group.gloo, async_op=True),
    )
    retire((mine, everyone))
    history = [
        {row[0]: row[1:] for row in block if row[0] >= 0}
        for block in everyone.view(size, HISTORY, width).tolist()
    ]
    common = set.intersection(*(set(h) for h in history))
    for position in sorted(common):
        found = debug.mismatch_message(
            group.name, ranks, [h[position] for h in history], label="found by the always-on check"
        )
        if found is not None:
            text, who = found
            return f"{text} (collective #{position} on the group; {_fix()})", who
    positions = [r[1] for r in table]
    if len(set(positions)) > 1:
        counts = ", ".join(f"rank {ranks[i]} at #{p}" for i, p in enumerate(positions))
        behind = tuple(ranks[i] for i, p in enumerate(positions) if p < max(positions))
        return (
            f"collective mismatch on group {group.name!r}: the ranks have issued different "
            f"numbers of collectives on it ({counts}): some rank skipped one or called one "
            f"more. {_fix()}",
            behind,
        )
    return (
        f"collective mismatch on group {group.name!r}: the ranks' collectives differed more "
        f"than {HISTORY} collectives ago. {_fix()}",
        (),
    )


def _fix() -> str:
    return (
        "make every rank of the group call the same collectives in the same order with the "
        "same shapes, dtypes and ops; MEGALITH_COMM_DEBUG=1 checks each one as it is called"
    )
