"""Timings of a pipeline step: what each rank computed when, and the bubble measured from it.

On a GPU the host only launches the passes, so time.perf_counter() around a pass
measures the launch. There the spans come from CUDA events on the compute stream,
put on the host clock through one event recorded right after a synchronize at the
first step, and read when the stats are (CudaClock): spans, measured_bubble and the
simulator's comparison then mean GPU time, and timing never stalls a step.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from .simulator import PassTimes

Span = tuple[str, int, int, float, float]  # kind, stage, micro-batch, start, end (perf_counter s)


@dataclass
class StepStats:
    """One rank's step. Times are time.perf_counter() (CLOCK_MONOTONIC: comparable between
    processes of one machine). spans hold compute only; waiting for messages is idle."""

    start: float = 0.0
    end: float = 0.0
    recv_wait_s: float = 0.0
    spans: list[Span] = field(default_factory=list)
    sent: dict[tuple[int, int], float] = field(default_factory=dict)  # (tag, mb) -> posted
    received: dict[tuple[int, int], tuple[float, float]] = field(default_factory=dict)
    gpu_time: bool = False  # spans from CUDA events (CudaClock)
    pending: Any = None  # the CudaClock whose events are not read yet (see resolved())

    @property
    def wall_s(self) -> float:
        return self.end - self.start

    @property
    def busy_s(self) -> float:
        return sum(t1 - t0 for _, _, _, t0, t1 in self.spans)

    @property
    def idle_fraction(self) -> float:
        return 0.0 if self.wall_s <= 0 else 1.0 - self.busy_s / self.wall_s


class HostClock:
    """Pass times on the host: CPU ranks, where a pass runs while it is called."""

    def start(self) -> float:
        return time.perf_counter()

    def now(self) -> Any:
        return time.perf_counter()

    def finish(self, stats: StepStats) -> None:
        stats.end = time.perf_counter()


class CudaClock:
    """Pass times on the GPU, as host perf_counter() times (see the module docstring).

    One synchronize, at the first step, pins an event to the host clock; every later
    time is that host time plus the GPU's elapsed time since the event. A step's
    events are read when its stats are (resolve()), by then long done, so timing
    adds no synchronize to the steps themselves and the host can run ahead.
    """

    def __init__(self, device: torch.device):
        self.device = device
        self._origin: Any = None
        self._origin_s = 0.0

    def start(self) -> Any:
        if self._origin is None:
            torch.cuda.synchronize(self.device)
            self._origin = self.now()
            self._origin_s = time.perf_counter()
        return self.now()

    def now(self) -> Any:
        event = torch.cuda.Event(enable_timing=True)
        event.record(torch.cuda.current_stream(self.device))
        return event

    def _host(self, event: Any) -> float:
        return self._origin_s + self._origin.elapsed_time(event) / 1e3

    def finish(self, stats: StepStats) -> None:
        stats.end = self.now()
        stats.gpu_time = True
        stats.pending = self

    def resolve(self, stats: StepStats) -> None:
        stats.end.synchronize()
        stats.spans = [
            (k, s, mb, self._host(t0), self._host(t1)) for k, s, mb, t0, t1 in stats.spans
        ]
        stats.start, stats.end = self._host(stats.start), self._host(stats.end)
        stats.pending = None


def clock_for(device: torch.device) -> HostClock | CudaClock:
    return CudaClock(device) if device.type == "cuda" else HostClock()


def resolved(stats: StepStats | None) -> StepStats | None:
    """stats with GPU event times turned into host times (waits for the step's end)."""
    if stats is not None and stats.pending is not None:
        stats.pending.resolve(stats)
    return stats


def measured_bubble(ranks: Sequence[StepStats]) -> float:
    """1 - (sum of busy time) / (pp x makespan), the makespan from the earliest start to
    the latest end over the ranks: the simulator's bubble_fraction, measured."""
    start = min(s.start for s in ranks)
    makespan = max(s.end for s in ranks) - start
    return 1.0 - sum(s.busy_s for s in ranks) / (len(ranks) * makespan)


def comm_latency(ranks: Sequence[StepStats]) -> float:
    """Mean time from a send's post to its arrival, over messages the receiver was
    already waiting for (so the time is transit, not the receiver being busy). On GPUs
    a send is posted when the host queues it, long before its data exists, so there
    the host sees no transit: 0 (ranks with gpu_time are left out)."""
    ranks = [s for s in ranks if not s.gpu_time]
    sent = {k: t for s in ranks for k, t in s.sent.items()}
    hops = [
        end - sent[k]
        for s in ranks
        for k, (start, end) in s.received.items()
        if k in sent and start <= sent[k]
    ]
    return sum(hops) / len(hops) if hops else 0.0


def mean_pass_times(
    ranks: Sequence[StepStats], num_stages: int | None = None
) -> PassTimes | list[PassTimes]:
    """The mean measured time of each kind of pass, for simulate(): one PassTimes, or
    with num_stages one per stage. A split backward's B is I + W; comm is
    comm_latency(ranks)."""
    comm = comm_latency(ranks)
    by_key: dict[tuple[str, int | None], list[float]] = {}
    for s in ranks:
        for kind, stage, _, t0, t1 in s.spans:
            by_key.setdefault((kind, stage if num_stages else None), []).append(t1 - t0)

    def times(stage: int | None) -> PassTimes:
        def mean(kind: str) -> float | None:
            v = by_key.get((kind, stage))
            return sum(v) / len(v) if v else None

        i, w = mean("I"), mean("W")
        backward = mean("B")
        if backward is None:
            backward = (i or 0.0) + (w or 0.0)
        return PassTimes(
            forward=mean("F") or 0.0,
            backward=backward,
            backward_input=i,
            backward_weight=w,
            comm=comm,
        )

    if num_stages is None:
        return times(None)
    return [times(s) for s in range(num_stages)]
