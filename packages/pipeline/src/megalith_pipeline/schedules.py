"""The schedules: GPipe, 1F1B, interleaved 1F1B and zero-bubble (ZB-H1, ZB-V), by name.

    make_schedule("1f1b", pp=4, num_microbatches=8)
    make_schedule("interleaved", pp=4, num_microbatches=8, chunks=2)
    make_schedule("zb-v", pp=4, num_microbatches=8)  # two chunks per rank, in a V

Micro-batches run in ascending order through every stage, in forward and in
backward, so the messages of one (stage, direction) channel are sent and received
in the same order. Each schedule is simulated once with unit pass times when it is
built; one that would not complete raises here, on every rank, before any
communication.
"""

from __future__ import annotations

from collections.abc import Callable

from .schedule import BACKWARD, FORWARD, Action, Schedule, check_counts, interleaved_placement
from .simulator import simulate
from .zero_bubble import zb_h1_orders
from .zero_bubble_v import v_placement, zb_v_orders

NAMES = ("gpipe", "1f1b", "interleaved", "zb-h1", "zb-v")
_ALIASES = {
    "interleaved-1f1b": "interleaved",
    "zbh1": "zb-h1",
    "zero-bubble": "zb-h1",
    "zbv": "zb-v",
    "zero-bubble-v": "zb-v",
}
# Virtual stages per rank each schedule runs (None: any, default 2).
_CHUNKS = {"gpipe": 1, "1f1b": 1, "zb-h1": 1, "zb-v": 2, "interleaved": None}
_STAGES = {1: "one stage", 2: "two stages"}


def _merge_1f1b(forwards: list[Action], backwards: list[Action], warmup: int) -> list[Action]:
    """`warmup` forwards, then one forward and one backward in turn, then the rest."""
    warmup = min(warmup, len(forwards))
    order = forwards[:warmup]
    rest_f, rest_b = forwards[warmup:], list(backwards)
    while rest_f:
        order.append(rest_f.pop(0))
        order.append(rest_b.pop(0))
    return order + rest_b


def gpipe_orders(pp: int, m: int) -> list[list[Action]]:
    """Every forward, then every backward: m micro-batches of activations held at once."""
    return [
        [Action(FORWARD, r, mb) for mb in range(m)] + [Action(BACKWARD, r, mb) for mb in range(m)]
        for r in range(pp)
    ]


def one_f_one_b_orders(pp: int, m: int) -> list[list[Action]]:
    """PipeDream-flush: rank r runs pp - r - 1 forwards ahead, then alternates; at most
    pp - r micro-batches of activations are alive on rank r."""
    orders = []
    for r in range(pp):
        fwd = [Action(FORWARD, r, mb) for mb in range(m)]
        bwd = [Action(BACKWARD, r, mb) for mb in range(m)]
        orders.append(_merge_1f1b(fwd, bwd, pp - r - 1))
    return orders


def _groups(pp: int, m: int) -> list[range]:
    """Micro-batch groups of at least pp (all of them when m < pp), the larger ones first."""
    if m <= pp:
        return [range(m)]
    k = m // pp
    q, extra = divmod(m, k)
    out, start = [], 0
    for i in range(k):
        n = q + (1 if i < extra else 0)
        out.append(range(start, start + n))
        start += n
    return out


def interleaved_orders(pp: int, m: int, chunks: int) -> list[list[Action]]:
    """Interleaved 1F1B (Narayanan et al. 2021): stage c * pp + r on rank r.

    Micro-batches go in groups: a group runs through chunk 0, then chunk 1... in
    forward, and through the chunks in reverse in backward. Rank r runs
    2 (pp - r - 1) + (chunks - 1) g forwards before its first backward, g the first
    group's size. Groups are pp micro-batches when pp divides m (Megatron's
    schedule); otherwise m is cut into m // pp groups as even as possible, larger
    first: a last group smaller than pp would make the first rank's warm-up reach
    forwards that the last rank sends only after a backward it waits for (a
    deadlock; pp 5, m 7 is one).
    """
    groups = _groups(pp, m)
    orders = []
    for r in range(pp):
        fwd = [Action(FORWARD, c * pp + r, mb) for g in groups for c in range(chunks) for mb in g]
        bwd = [
            Action(BACKWARD, c * pp + r, mb)
            for g in groups
            for c in reversed(range(chunks))
            for mb in g
        ]
        warmup = 2 * (pp - r - 1) + (chunks - 1) * len(groups[0])
        orders.append(_merge_1f1b(fwd, bwd, warmup))
    return orders


def canonical_name(name: str) -> str:
    key = name.lower().replace("_", "-")
    key = _ALIASES.get(key, key)
    if key not in NAMES:
        raise ValueError(f"unknown pipeline schedule {name!r}; expected one of {', '.join(NAMES)}")
    return key


def make_schedule(name: str, pp: int, num_microbatches: int, chunks: int | None = None) -> Schedule:
    """The named schedule for pp ranks and num_microbatches micro-batches.

    chunks: virtual stages per rank; 'interleaved' takes any (default 2), 'zb-v'
    exactly 2, the others 1. Raises ValueError naming the numbers for counts the
    schedule cannot run.
    """
    key = canonical_name(name)
    fixed = _CHUNKS[key]
    if chunks is None:
        chunks = 2 if fixed is None else fixed
    check_counts(key, pp, num_microbatches, chunks)
    if fixed is not None and chunks != fixed:
        raise ValueError(
            f"schedule {key!r} runs {_STAGES[fixed]} per rank, got chunks={chunks}; "
            "use schedule='interleaved' for any number of virtual stages per rank"
        )
    builders: dict[str, Callable[[], list[list[Action]]]] = {
        "gpipe": lambda: gpipe_orders(pp, num_microbatches),
        "1f1b": lambda: one_f_one_b_orders(pp, num_microbatches),
        "interleaved": lambda: interleaved_orders(pp, num_microbatches, chunks),
        "zb-h1": lambda: zb_h1_orders(pp, num_microbatches),
        "zb-v": lambda: zb_v_orders(pp, num_microbatches),
    }
    schedule = Schedule(
        name=key,
        pp=pp,
        num_microbatches=num_microbatches,
        chunks=chunks,
        placement=v_placement(pp) if key == "zb-v" else interleaved_placement(pp, chunks),
        orders=tuple(tuple(o) for o in builders[key]()),
    )
    simulate(schedule)  # raises ScheduleDeadlock naming the stuck passes
    return schedule
