"""The schedule simulator: when each pass runs, given how long passes take.

    t = simulate(make_schedule("1f1b", 4, 8), PassTimes(forward=1, backward=2))
    print(t.render())          # one text row per rank
    t.bubble_fraction          # 3/11 here: (p - 1) / (m + p - 1)

Each rank runs its passes in the schedule's order; a pass starts when the rank
is free and its inputs exist: F(s, mb) needs F(s-1, mb); B or I (s, mb) needs
F(s, mb) and the input gradient from B or I (s+1, mb); W(s, mb) needs I(s, mb).
A dependency on another rank arrives `comm` later. The bubble fraction is the
idle share of pp x makespan. A schedule whose order can never complete raises
ScheduleDeadlock naming the passes that wait (make_schedule runs this check).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from .schedule import BACKWARD, FORWARD, INPUT_GRAD, WEIGHT_GRAD, Action, Schedule


class ScheduleDeadlock(ValueError):
    """The schedule's pass order cannot complete."""


@dataclass(frozen=True)
class PassTimes:
    """How long each kind of pass takes (any unit), and a message between ranks.

    backward is a whole backward; backward_input and backward_weight (the split
    backward of zero-bubble schedules) default to half of it each.
    """

    forward: float = 1.0
    backward: float = 2.0
    backward_input: float | None = None
    backward_weight: float | None = None
    comm: float = 0.0

    def of(self, kind: str) -> float:
        if kind == FORWARD:
            return self.forward
        if kind == BACKWARD:
            return self.backward
        if kind == INPUT_GRAD:
            return self.backward / 2 if self.backward_input is None else self.backward_input
        return self.backward / 2 if self.backward_weight is None else self.backward_weight


@dataclass(frozen=True)
class Span:
    start: float
    end: float
    action: Action


@dataclass(frozen=True)
class Timeline:
    schedule: Schedule
    spans: tuple[tuple[Span, ...], ...]  # per rank, in execution order

    @property
    def makespan(self) -> float:
        return max((row[-1].end for row in self.spans if row), default=0.0)

    def busy(self, rank: int) -> float:
        return sum(s.end - s.start for s in self.spans[rank])

    @property
    def bubble_fraction(self) -> float:
        total = self.schedule.pp * self.makespan
        return 0.0 if total == 0 else 1.0 - sum(map(self.busy, range(self.schedule.pp))) / total

    def render(self, width: int = 100) -> str:
        """A text timeline: one row per rank; a pass shows as its kind and micro-batch
        (`F3`; on a rank's second chunk in lower case, `f3`, and from the third on with
        the chunk after a colon, `F3:2`), idle time as '.'."""
        scale = width / self.makespan if self.makespan else 1.0
        lines = [f"{self.schedule}: bubble {self.bubble_fraction:.3f}, makespan {self.makespan:g}"]
        for r, row in enumerate(self.spans):
            cells = ["."] * width
            for span in row:
                a, lo = span.action, round(span.start * scale)
                hi = max(lo + 1, round(span.end * scale))
                chunk = self.schedule.chunk_of(a.stage)
                label = f"{a.kind.lower() if chunk == 1 else a.kind}{a.mb}"
                if chunk > 1:
                    label += f":{chunk}"
                text = (label + "-" * (hi - lo))[: hi - lo] if hi - lo > 1 else a.kind
                cells[lo:hi] = list(text)
            lines.append(f"rank {r} |{''.join(cells[:width])}|")
        return "\n".join(lines)


def _deps(a: Action, last_stage: int) -> list[tuple[str, int, int]]:
    """Keys of what a pass needs; 'G' is whichever pass produces (s, mb)'s input gradient."""
    if a.kind == FORWARD:
        return [("F", a.stage - 1, a.mb)] if a.stage > 0 else []
    if a.kind == WEIGHT_GRAD:
        return [("I", a.stage, a.mb)]
    deps = [("F", a.stage, a.mb)]
    if a.stage < last_stage:
        deps.append(("G", a.stage + 1, a.mb))
    return deps


def _keys(a: Action) -> list[tuple[str, int, int]]:
    if a.kind == FORWARD:
        return [("F", a.stage, a.mb)]
    if a.kind == INPUT_GRAD:
        return [("I", a.stage, a.mb), ("G", a.stage, a.mb)]
    if a.kind == BACKWARD:
        return [("I", a.stage, a.mb), ("G", a.stage, a.mb), ("W", a.stage, a.mb)]
    return [("W", a.stage, a.mb)]


def simulate(schedule: Schedule, times: PassTimes | Sequence[PassTimes] | None = None) -> Timeline:
    """Plays the schedule out; ScheduleDeadlock if some rank would wait forever.

    times: one PassTimes for every stage, or one per stage.
    """
    per_stage = _per_stage(schedule, times)
    _check_complete(schedule)
    last = schedule.num_stages - 1
    finish: dict[tuple[str, int, int], tuple[float, int]] = {}  # key -> (time, rank)
    pos = [0] * schedule.pp
    free = [0.0] * schedule.pp
    spans: list[list[Span]] = [[] for _ in range(schedule.pp)]
    remaining = sum(len(o) for o in schedule.orders)
    while remaining:
        progressed = False
        for r, order in enumerate(schedule.orders):
            while pos[r] < len(order):
                a = order[pos[r]]
                deps = _deps(a, last)
                if any(d not in finish for d in deps):
                    break
                times = per_stage[a.stage]
                ready = max(
                    [free[r]]
                    + [finish[d][0] + (times.comm if finish[d][1] != r else 0.0) for d in deps]
                )
                end = ready + times.of(a.kind)
                spans[r].append(Span(ready, end, a))
                for k in _keys(a):
                    finish[k] = (end, r)
                free[r], pos[r] = end, pos[r] + 1
                remaining -= 1
                progressed = True
        if not progressed:
            stuck = [
                f"rank {r} at {schedule.orders[r][pos[r]]!r}"
                for r in range(schedule.pp)
                if pos[r] < len(schedule.orders[r])
            ]
            raise ScheduleDeadlock(
                f"{schedule}: the pass order cannot complete; waiting forever: {', '.join(stuck)}"
            )
    return Timeline(schedule, tuple(tuple(row) for row in spans))


def _per_stage(
    schedule: Schedule, times: PassTimes | Sequence[PassTimes] | None
) -> list[PassTimes]:
    if times is None or isinstance(times, PassTimes):
        return [times or PassTimes()] * schedule.num_stages
    times = list(times)
    if len(times) != schedule.num_stages:
        raise ValueError(
            f"simulate: {len(times)} PassTimes for the {schedule.num_stages} stages of {schedule}"
        )
    return times


def _check_complete(schedule: Schedule) -> None:
    """Every stage's passes are on its rank, each exactly once."""
    split = schedule.splits_backward
    kinds: Sequence[str] = (FORWARD, INPUT_GRAD, WEIGHT_GRAD) if split else (FORWARD, BACKWARD)
    want = {
        (k, s, mb)
        for s in range(schedule.num_stages)
        for mb in range(schedule.num_microbatches)
        for k in kinds
    }
    got = [(a.kind, a.stage, a.mb) for order in schedule.orders for a in order]
    misplaced = [
        a
        for r, order in enumerate(schedule.orders)
        for a in order
        if schedule.rank_of(a.stage) != r
    ]
    if sorted(got) != sorted(want) or misplaced:
        raise ValueError(f"{schedule}: the orders do not hold each pass once on its stage's rank")


def theory_bubble_1f1b(pp: int, num_microbatches: int) -> float:
    """(p - 1) / (m + p - 1): the bubble of GPipe and 1F1B when B takes a fixed multiple of F."""
    return (pp - 1) / (num_microbatches + pp - 1)
