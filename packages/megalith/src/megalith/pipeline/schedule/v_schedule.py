"""PipelineGraph: ColossalAI's ZB-V schedule builder, on megalith_pipeline's ZB-V order.

ColossalAI's scripts (its llama benchmark) build one and hand `get_v_schedule()` to
HybridParallelPlugin(scheduler_nodes=...). megalith's plugin builds the ZB-V order
itself (megalith_pipeline.zero_bubble_v) and ignores scheduler_nodes with a warning:
the order changes only speed and memory, never the numbers. The costs and memory
figures are kept as given; the order returned is megalith_pipeline's, so what a script
prints or inspects matches what runs.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass


@dataclass(eq=True, frozen=True)
class ScheduledNode:
    """One pass of one micro-batch on one rank: type "F" (forward), "B" (input
    gradient) or "W" (weight gradient); chunk 0 going down the V, 1 coming back."""

    type: str
    chunk: int
    stage: int
    minibatch: int
    start_time: int = 0
    completion_time: int = 0
    rollback: bool = False


_KIND = {"F": "F", "I": "B", "W": "W"}  # megalith_pipeline's pass names -> ColossalAI's


class PipelineGraph:
    """ColossalAI's constructor: n_stage pipeline ranks, n_micro micro-batches, the
    per-pass costs (f, b, w, communication) and activation memory (f, b, w)."""

    def __init__(
        self,
        n_stage: int,
        n_micro: int,
        f_cost: float,
        b_cost: float,
        w_cost: float,
        c_cost: float,
        f_mem: float,
        b_mem: float,
        w_mem: float,
        max_mem: float | None = None,
    ) -> None:
        for name, value in (("n_stage", n_stage), ("n_micro", n_micro)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"PipelineGraph: {name}={value!r}; expected an int >= 1")
        self.n_stage, self.n_micro = n_stage, n_micro
        self.fbw_cost = [f_cost, b_cost, w_cost]
        self.c_cost = c_cost
        self.fbw_mem = [f_mem, b_mem, w_mem]
        self.max_mem = max_mem or f_mem * n_stage * 2

    def get_v_schedule(self, only_run_time: bool = False) -> list[list[ScheduledNode]] | float:
        """Each rank's passes in order (megalith_pipeline's ZB-V), or with only_run_time
        the step's length in cost units (megalith_pipeline's simulator, every pass taking
        its given cost and every message between ranks c_cost)."""
        from ...booster.plugin.base import require

        mp = require("megalith_pipeline", "megalith-pipeline", "PipelineGraph")
        make_schedule, PassTimes, simulate = (
            mp.schedules.make_schedule,
            mp.simulator.PassTimes,
            mp.simulator.simulate,
        )
        schedule = make_schedule("zbv", self.n_stage, self.n_micro)
        if only_run_time:
            f, b, w = self.fbw_cost
            times = PassTimes(forward=f, backward=b + w, backward_input=b, backward_weight=w)
            return float(simulate(schedule, dataclasses.replace(times, comm=self.c_cost)).makespan)
        pp = self.n_stage
        return [
            [ScheduledNode(_KIND[a.kind], 0 if a.stage < pp else 1, rank, a.mb) for a in order]
            for rank, order in enumerate(schedule.orders)
        ]
