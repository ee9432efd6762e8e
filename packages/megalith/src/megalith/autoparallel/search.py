"""search(): every legal plan of a model on a cluster for a fixed global batch, ranked
by predicted step time, with a reason for the winner and for each family it beat.

Pruning, so that a 70B model over 1,024 GPUs plans in seconds:
- a layout (dp, tp, pp, sp) or ZeRO stage whose smallest configuration (micro-batch 1,
  every layer checkpointed, the most offloaded) does not fit the device is dropped whole
  (the host is checked plan by plan: a smaller offloaded share may fit it);
- at one micro-batch size only the first configuration that fits in the order
  (checkpointing 0, 0.5, 1) x (offload none, then growing shares) is kept: more
  checkpointing or offloading at the same micro-batch only adds time (dominated);
- without a pipeline a larger micro-batch needs more memory, so the first one that
  does not fit ends that loop, but for the whole per-rank batch as one micro-batch (no
  accumulated gradients), which is tried then too;
- a pipeline with fewer micro-batches than stages idles half its ranks: not tried;
- beside a pipeline sp grows only while the same tp x pp at the smaller sp (sp = 1
  included) fits no plan without checkpointing: there a larger sp is what holds a
  sequence's activations; past it its gain over dp is a smaller bubble, paid for with
  collectives every layer (all sp x pp layouts made 70B over 1,024 GPUs plan 7x slower);
- pipelines are simulated last, in order of a lower bound (their time with the
  bubble's least for uniform stages, (pp - 1) / chunks passes, none for ZB-V), and only
  while the bound can still reach the top `top`.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any

from . import explain, space
from .cost import score, step_parts
from .knobs import CHUNKS, OFFLOADS, SCHEDULES, Knobs
from .memory import Memory, peak_memory
from .types import Candidate, Cluster, ModelAnalysis


class NoFeasiblePlan(ValueError):
    """No plan fits. smallest_bytes: the least device memory any legal plan needs;
    closest: the knobs of that plan, as text."""

    def __init__(self, message: str, smallest_bytes: int = 0, closest: str = "") -> None:
        super().__init__(message)
        self.smallest_bytes = smallest_bytes
        self.closest = closest


def search(
    analysis: ModelAnalysis,
    cluster: Cluster,
    *,
    global_batch_tokens: int,
    memory_headroom: float = 0.9,
    top: int = 10,
    precision: str = "bf16",
    max_micro_batch: int = space.MAX_MICRO_BATCH,
    model: Any = None,
    **constraints: Any,
) -> list[Candidate]:
    """The `top` fastest plans, best first; the first carries the winner's reason and
    each rejected family's (Candidate.reason, one per line). constraints: any of
    space.KNOBS fixed to a value or a tuple of values. model: the analysed model (meta is
    enough) for dp-only ZeRO plans' exact model state. NoFeasiblePlan when nothing fits."""
    unknown = set(constraints) - set(space.KNOBS)
    if unknown:
        raise TypeError(
            f"search: unknown constraint(s) {', '.join(sorted(unknown))}; the knobs are "
            + ", ".join(space.KNOBS)
        )
    constraints = {k: v for k, v in constraints.items() if v is not None}
    _check(cluster, memory_headroom, top, max_micro_batch)
    _check_constraints(constraints)
    seqs = _sequences(analysis, global_batch_tokens)
    device = cluster.device_memory_bytes or cluster.profile.device_memory_bytes
    host = cluster.host_memory_bytes or cluster.profile.host_memory_bytes
    budget = int(device * memory_headroom)
    host_budget = int(host * memory_headroom) // cluster.per_node
    ctx = _Context(
        analysis,
        cluster,
        model,
        constraints,
        budget=budget,
        host_budget=host_budget,
        max_micro_batch=max_micro_batch,
        record=explain.Record(budget, host_budget, memory_headroom, precision),
    )
    pool: list[tuple[float, int, Knobs, Memory]] = []
    layouts = list(space.layouts(analysis, cluster, constraints))
    if not layouts:
        fixed = ", ".join(
            f"{k}={constraints[k]}" for k in ("dp", "tp", "pp", "sp") if k in constraints
        )
        ctx.record.illegal(
            f"{fixed or 'the layout'}: no dp x tp x pp x sp of the world of {cluster.world} has "
            f"it (tp divides the {cluster.per_node} devices of a node, dp x tp x pp x sp = "
            f"{cluster.world})"
        )
    fits_plain: set[tuple[int, int]] = set()  # (tp, pp) fitting without ckpt at a smaller sp
    for dp, tp, pp, sp in layouts:
        if sp > 1 and pp > 1 and (tp, pp) in fits_plain:
            continue
        why = space.why_illegal_layout(analysis, cluster, tp, pp, sp)
        if why is None and seqs % dp:
            why = f"dp={dp}: the global batch of {seqs} sequences does not divide by it"
        if why:
            ctx.record.illegal(why)
            continue
        first = "1f1b" if pp > 1 else "none"
        base = Knobs(dp=dp, tp=tp, pp=pp, sp=sp, schedule=first, precision=precision)
        for knobs, memory in _fitting(ctx, base, seqs // dp):
            bound = sum(step_parts(analysis, cluster, knobs, simulate=False).values())
            pool.append((bound, len(pool), knobs, memory))
            if knobs.ckpt == 0:
                fits_plain.add((tp, pp))
    if not pool:
        raise ctx.record.no_plan(analysis, cluster, constraints)
    ranked = _rank(analysis, cluster, pool, top)
    return explain.annotate(ranked, ctx.record, pool, lambda k, m: score(analysis, cluster, k, m))


@dataclass
class _Context:
    analysis: ModelAnalysis
    cluster: Cluster
    model: Any
    constraints: dict[str, Any]
    budget: int
    host_budget: int
    max_micro_batch: int
    record: explain.Record


def _check(cluster: Cluster, headroom: float, top: int, max_micro_batch: int) -> None:
    """The cluster and the search's own settings, before any work."""
    for name, value in (("nodes", cluster.nodes), ("gpus_per_node", cluster.per_node)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"search: cluster {name}={value!r}; give an int >= 1")
    for name, value in (
        ("device_memory_bytes", cluster.device_memory_bytes),
        ("host_memory_bytes", cluster.host_memory_bytes),
    ):
        if value is not None and value <= 0:
            raise ValueError(f"search: cluster {name}={value}; give a positive byte count")
    if cluster.nodes > 1 and cluster.inter_node is None:
        raise ValueError(
            f"search: a cluster of {cluster.nodes} nodes needs inter_node, the link between "
            "nodes (AlphaBeta(latency_s, bandwidth) per node, each way)"
        )
    if not 0.0 < headroom <= 1.0:
        raise ValueError(f"search: memory_headroom={headroom}; give the usable share in (0, 1]")
    if top < 1 or max_micro_batch < 1:
        raise ValueError(f"search: top={top}, max_micro_batch={max_micro_batch}; both >= 1")


#: what each constraint may be (a value, or a collection of them)
_DOMAINS: dict[str, Any] = {
    **{k: "an int >= 1" for k in ("dp", "tp", "pp", "sp", "micro_batch", "num_microbatches")},
    "zero_stage": (0, 1, 2, 3),
    "offload": OFFLOADS,
    "schedule": SCHEDULES,
    "offload_fraction": "a share in [0, 1]",
    "ckpt": "a share in [0, 1]",
}


def _check_constraints(constraints: dict[str, Any]) -> None:
    for name, want in constraints.items():
        values = want if isinstance(want, (tuple, list, set, frozenset)) else [want]
        domain = _DOMAINS[name]
        for v in values:
            if isinstance(domain, tuple):
                ok = v in domain
            elif domain.startswith("an int"):
                ok = isinstance(v, int) and not isinstance(v, bool) and v >= 1
            else:
                ok = isinstance(v, (int, float)) and not isinstance(v, bool) and 0 <= v <= 1
            if not ok:
                raise ValueError(
                    f"search: constraint {name}={want!r}: {v!r} is not "
                    + (f"one of {domain}" if isinstance(domain, tuple) else domain)
                )


def _sequences(analysis: ModelAnalysis, global_batch_tokens: int) -> int:
    seq = analysis.seq_len
    if global_batch_tokens < seq or global_batch_tokens % seq:
        raise ValueError(
            f"search: global_batch_tokens={global_batch_tokens} is not a whole number of "
            f"sequences of {seq} tokens; give a multiple of {seq}"
        )
    return global_batch_tokens // seq


def _fitting(ctx: _Context, base: Knobs, per_rank: int) -> Iterator[tuple[Knobs, Memory]]:
    """(knobs, memory) of every undominated plan of one layout that fits."""
    hybrid = base.tp * base.pp * base.sp > 1
    c, record = ctx.constraints, ctx.record
    micro = [b for b in space.divisors(per_rank) if b <= ctx.max_micro_batch]
    micro = space.allowed(c, "micro_batch", micro)
    micro = [b for b in micro if space.allowed(c, "num_microbatches", [per_rank // b])]
    if not micro:
        record.illegal(
            f"dp={base.dp}: {per_rank} sequences per dp rank, no micro-batch of at most "
            f"{ctx.max_micro_batch} of them that the micro_batch / num_microbatches "
            "constraints allow"
        )
    ckpts = space.allowed(c, "ckpt", space.CKPT_SHARES)
    if not ckpts:
        record.illegal(f"ckpt={c['ckpt']}: the shares the search tries are {space.CKPT_SHARES}")
    layers = ctx.analysis.layers
    stages = space.zero_stages(hybrid, c)
    if not stages:
        record.illegal(
            f"zero_stage={c['zero_stage']} with tp={base.tp} pp={base.pp} sp={base.sp}: the "
            "hybrid plugin runs ZeRO stages 0-2"
        )
    for stage in stages:
        offloads = space.offloads(hybrid, stage, c)
        if not offloads:
            record.illegal(
                f"offload={c.get('offload')} offload_fraction={c.get('offload_fraction')} at "
                f"zero_stage={stage}{' (hybrid: all or nothing)' if hybrid else ''}: "
                f"offloading needs ZeRO stage >= 1, a share in {space.OFFLOAD_FRACTIONS}"
            )
        schedules = space.schedules(base.pp, c)
        if not schedules:
            record.illegal(
                f"schedule={c['schedule']} at pp={base.pp}: pp > 1 takes 1f1b, interleaved "
                "or zbv, pp = 1 takes none"
            )
        for schedule in schedules:
            reason = space.why_illegal_tied(ctx.analysis, base.pp, stage, schedule)
            if reason:
                record.illegal(reason)
                continue
            if base.pp * CHUNKS[schedule] > layers:
                record.illegal(
                    f"pp={base.pp} x {CHUNKS[schedule]} chunks of {schedule}: "
                    f"more stages than the {layers} layers"
                )
                continue
            if not (micro and ckpts and offloads):
                continue
            smallest = _knobs(base, stage, schedule, offloads[-1], micro[0], per_rank, ckpts[-1])
            if smallest is None:
                groups = " (or not in groups of pp)" if schedule == "interleaved" else ""
                record.illegal(
                    f"pp={base.pp} {schedule}: {per_rank} sequences per dp rank in "
                    f"micro-batches of {micro[0]} or more are fewer than the stages{groups}"
                )
                continue
            yield from _plans(ctx, base, stage, schedule, offloads, micro, ckpts, per_rank)


def _plans(
    ctx: _Context,
    base: Knobs,
    stage: int,
    schedule: str,
    offloads: list[tuple[str, float]],
    micro: list[int],
    ckpts: list[float],
    per_rank: int,
) -> Iterator[tuple[Knobs, Memory]]:
    """The undominated plans of one layout, stage and schedule that fit. Without a
    pipeline a larger micro-batch needs more memory, except where it leaves a single
    micro-batch: then no gradients accumulate across micro-batches (whole gradients at
    stages 2-3) and stage 0's gradients replace the activations backward frees; so the
    family's most frugal plans are micro-batch micro[0] and, when it is one, the whole
    batch (per_rank), each with the most checkpointing and offload."""
    single = micro[-1] if micro[-1] == per_rank and base.pp == 1 else None
    frugal = [_knobs(base, stage, schedule, offloads[-1], b, per_rank, ckpts[-1])
              for b in dict.fromkeys([micro[0], single or micro[0]])]  # fmt: skip
    if not any(k is not None and _fits(ctx, k, device_only=True) for k in frugal):
        return
    tried: set[int] = set()
    queue = list(micro)
    while queue:
        b = queue.pop(0)
        tried.add(b)
        found = False
        for ckpt in ckpts:
            for off in offloads:
                k = _knobs(base, stage, schedule, off, b, per_rank, ckpt)
                m = None if k is None else _fits(ctx, k)
                if m is not None:
                    found = True
                    yield k, m
                    break
            if found and off == offloads[0]:
                break
        if not found and base.pp == 1:  # larger ones need more, but for the single one
            queue = [single] if single is not None and single not in tried else []


def _knobs(
    base: Knobs,
    stage: int,
    schedule: str,
    off: tuple[str, float],
    b: int,
    per_rank: int,
    ckpt: float,
) -> Knobs | None:
    m = per_rank // b
    if base.pp > 1 and m < base.pp:
        return None  # fewer micro-batches than stages: half the pipeline idles (dominated)
    if base.pp > 1 and schedule == "interleaved" and m % base.pp:
        return None  # interleaving runs micro-batches in groups of pp
    return replace(
        base,
        zero_stage=stage,
        schedule=schedule,
        offload=off[0],
        offload_fraction=off[1],
        micro_batch=b,
        num_microbatches=m,
        ckpt=ckpt,
    )


def _fits(ctx: _Context, k: Knobs, device_only: bool = False) -> Memory | None:
    """k's memory if it fits the device and the host (device_only: the device; the
    pre-check of a family's most frugal plan, whose full offload may overflow a host that
    a smaller share fits)."""
    try:
        m = peak_memory(ctx.analysis, ctx.cluster, k, ctx.model)
    except ValueError as e:  # a schedule that cannot run these counts
        ctx.record.illegal(f"{k.schedule} at pp={k.pp}, {k.num_microbatches} micro-batches: {e}")
        return None
    if m.device > ctx.budget or (m.host > ctx.host_budget and not device_only):
        ctx.record.too_big(k, m)
        return None
    return m


def _rank(analysis: ModelAnalysis, cluster: Cluster, pool: list, top: int) -> list[Candidate]:
    """Exact scores in order of the lower bound, until the bound passes the top-th best."""
    best: list[tuple[float, int, Candidate]] = []  # a max-heap of the top, by -step
    for bound, i, knobs, memory in sorted(pool, key=lambda e: (e[0], e[1])):
        if len(best) >= top and bound > -best[0][0]:
            break
        c = score(analysis, cluster, knobs, memory)
        heapq.heappush(best, (-c.predicted_step_s, i, c))
        if len(best) > top:
            heapq.heappop(best)
    return [c for _, _, c in sorted(best, key=lambda e: (-e[0], e[1]))]
