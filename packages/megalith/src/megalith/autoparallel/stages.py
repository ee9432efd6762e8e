"""Which blocks each pipeline rank holds, and how many micro-batches' activations each
rank keeps at once under a schedule (from the schedule's pass order itself, I and W of a
split backward apart).

The embedding ("pre"), the layers and the head ("post"), as one list, are cut into
pp * chunks contiguous virtual stages as evenly as they go (the first stages take one
more when they do not divide), as megalith_pipeline's default "layers" balance cuts them
(the embedding and the head count as a layer each). Virtual stage s runs on the rank
megalith_pipeline places it on (interleaved: s % pp; ZB-V: the V over the ranks).
"""

from __future__ import annotations

from functools import lru_cache

from .knobs import PIPELINE_NAMES, Knobs
from .types import BlockCost, ModelAnalysis

#: micro-batches simulated at most (as a multiple of pp): past it a pipeline is in its
#: steady state, so more micro-batches add their per-micro-batch time and nothing else
SIM_MICROBATCH_CAP = 2


def virtual_stages(analysis: ModelAnalysis, stages: int) -> list[list[BlockCost]]:
    """The blocks of each virtual stage, pre and post included: megalith_pipeline's
    even cut ("layers" balance) of the embedding, the layers and the head as one list."""
    parts = [analysis.pre, *analysis.blocks, analysis.post]
    if stages > len(parts):  # more stages than parts: spread the layers, ends outside
        return _layers_only(analysis, stages)
    base, extra = divmod(len(parts), stages)
    out: list[list[BlockCost]] = []
    start = 0
    for s in range(stages):
        size = base + (1 if s < extra else 0)
        out.append(parts[start : start + size])
        start += size
    return out


def _layers_only(analysis: ModelAnalysis, stages: int) -> list[list[BlockCost]]:
    n = len(analysis.blocks)
    base, extra = divmod(n, stages)
    out: list[list[BlockCost]] = []
    start = 0
    for s in range(stages):
        size = base + (1 if s < extra else 0)
        out.append(list(analysis.blocks[start : start + size]))
        start += size
    out[0].insert(0, analysis.pre)
    out[-1].append(analysis.post)
    return out


def placement(knobs: Knobs) -> tuple[int, ...]:
    """The rank of each virtual stage."""
    pp, chunks = knobs.pp, knobs.chunks
    if knobs.schedule == "zbv":
        return tuple(range(pp)) + tuple(reversed(range(pp)))
    return tuple(s % pp for s in range(pp * chunks))


def simulated_microbatches(pp: int, m: int) -> int:
    return min(m, SIM_MICROBATCH_CAP * pp)


@lru_cache(maxsize=512)
def schedule(name: str, pp: int, m: int):  # -> megalith_pipeline.schedule.Schedule
    from megalith_pipeline.schedules import make_schedule

    return make_schedule(PIPELINE_NAMES[name], pp, m)


def peak_activations(
    name: str, pp: int, m: int, rank: int, kept: tuple[float, ...], held: tuple[float, ...]
) -> float:
    """The most activation bytes `rank` holds at once, walking its pass order: a
    micro-batch's forward of virtual stage s keeps kept[s] (checkpointed layers keep
    their inputs only) until its backward; a split backward's I pass (ZB-H1, ZB-V) has
    recomputed and holds held[s] (the whole stage's activations, which the graph kept for
    W) until its W pass frees them."""
    from megalith_pipeline.schedule import BACKWARD, FORWARD, INPUT_GRAD, WEIGHT_GRAD

    sched = schedule(name, pp, simulated_microbatches(pp, m))
    live = peak = 0.0
    for a in sched.orders[rank]:
        if a.kind == FORWARD:
            live += kept[a.stage]
        elif a.kind == INPUT_GRAD:
            live += held[a.stage] - kept[a.stage]
        elif a.kind == WEIGHT_GRAD:
            live -= held[a.stage]
        elif a.kind == BACKWARD:
            live -= kept[a.stage]
        peak = max(peak, live)
    return peak


def last_weight_stage(name: str, pp: int, m: int, rank: int) -> int:
    """The virtual stage of `rank`'s last weight-gradient pass (W, or B where backward is
    not split): the one pass that runs outside the dp wrapper's no_sync, so ZeRO
    reduces there (megalith_pipeline's executor)."""
    from megalith_pipeline.schedule import BACKWARD, WEIGHT_GRAD

    sched = schedule(name, pp, simulated_microbatches(pp, m))
    passes = [a for a in sched.orders[rank] if a.kind in (BACKWARD, WEIGHT_GRAD)]
    return passes[-1].stage


def passes_per_rank(name: str, pp: int, m: int) -> tuple[int, ...]:
    """Passes (F, B, I, W actions) each rank runs in a step of m micro-batches, from
    megalith_pipeline's schedule: every virtual stage on the rank runs a forward and a
    backward (a split one: I and W) per micro-batch, so the counts of the simulated
    micro-batches scale to m exactly."""
    m_sim = simulated_microbatches(pp, m)
    sched = schedule(name, pp, m_sim)
    return tuple(len(order) * m // m_sim for order in sched.orders)


def handoffs(where: tuple[int, ...]) -> tuple[tuple[bool, ...], tuple[bool, ...]]:
    """Per virtual stage (where: the rank of each): whether its forward's input comes from
    another rank (the stage before is elsewhere), and whether its backward's does (the
    stage after is elsewhere)."""
    last = len(where) - 1
    fwd = tuple(s > 0 and where[s - 1] != where[s] for s in range(last + 1))
    bwd = tuple(s < last and where[s + 1] != where[s] for s in range(last + 1))
    return fwd, bwd


def handoffs_per_rank(name: str, pp: int, m: int) -> tuple[int, ...]:
    """Passes each rank runs in a step of m micro-batches whose input another rank sends:
    forwards after a stage on another rank, backwards (I passes) before one; W passes
    take nothing (from megalith_pipeline's schedule, scaled to m as passes_per_rank)."""
    from megalith_pipeline.schedule import BACKWARD, FORWARD, INPUT_GRAD

    m_sim = simulated_microbatches(pp, m)
    sched = schedule(name, pp, m_sim)
    rank_of = {a.stage: r for r, order in enumerate(sched.orders) for a in order}
    last = max(rank_of)
    out = []
    for r, order in enumerate(sched.orders):
        n = 0
        for a in order:
            if a.kind == FORWARD and a.stage > 0:
                n += rank_of[a.stage - 1] != r
            elif a.kind in (BACKWARD, INPUT_GRAD) and a.stage < last:
                n += rank_of[a.stage + 1] != r
        out.append(n * m // m_sim)
    return tuple(out)
