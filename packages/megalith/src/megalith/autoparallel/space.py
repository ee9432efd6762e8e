"""The search space: which values of each knob are legal for a model on a cluster, and
the constraints a user fixes (a value or a tuple of values per knob).

Legality is what megalith can run (megalith.strategy.Strategy's own checks): world =
dp x tp x pp x sp; tp divides the heads and kv heads and stays inside a node; layers >=
pp x chunks; tp, pp or sp > 1 run in the hybrid plugin at ZeRO stage 0-2, which offloads
only everything to host memory; all_to_all sp (Ulysses) divides heads with tp, and the
sequence, beside tp and beside a pipeline (HybridParallelPlugin runs both); offloading needs a ZeRO stage >= 1; an embedding tied to the head
across pipeline stages trains at ZeRO stage 0 or 1 (why_illegal_tied).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from .types import Cluster, ModelAnalysis

KNOBS = (
    "dp",
    "tp",
    "pp",
    "sp",
    "zero_stage",
    "offload",
    "offload_fraction",
    "micro_batch",
    "num_microbatches",
    "ckpt",
    "schedule",
)
OFFLOAD_FRACTIONS = (0.25, 0.5, 1.0)
CKPT_SHARES = (0.0, 0.5, 1.0)
PIPELINE_SCHEDULES = ("1f1b", "interleaved", "zbv")
#: micro-batches (sequences) tried at most
MAX_MICRO_BATCH = 64


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def allowed(constraints: dict[str, Any], name: str, values: Any) -> list[Any]:
    """`values` kept to the user's constraint on `name` (a value or a collection)."""
    want = constraints.get(name)
    if want is None:
        return list(values)
    wanted = set(want) if isinstance(want, (tuple, list, set, frozenset)) else {want}
    return [v for v in values if v in wanted]


def why_illegal_tp(analysis: ModelAnalysis, cluster: Cluster, tp: int) -> str | None:
    if tp > 1 and analysis.family is None:
        return f"tp={tp}: {analysis.model} has no tensor-parallel policy (family None)"
    if analysis.heads and analysis.heads % tp:
        return f"tp={tp}: the model's {analysis.heads} heads are not divisible by {tp}"
    if analysis.kv_heads and analysis.kv_heads % tp:
        return f"tp={tp}: the model's {analysis.kv_heads} kv heads are not divisible by {tp}"
    if tp > cluster.per_node:
        return f"tp={tp}: more than the {cluster.per_node} devices of a node"
    return None


def why_illegal_layout(
    analysis: ModelAnalysis, cluster: Cluster, tp: int, pp: int, sp: int
) -> str | None:
    """Why (tp, pp, sp) cannot run this model on this cluster, or None."""
    world = cluster.world
    if world % (tp * pp * sp):
        return f"tp={tp} x pp={pp} x sp={sp} does not divide the world of {world}"
    reason = why_illegal_tp(analysis, cluster, tp)
    if reason:
        return reason
    if pp > analysis.layers:
        return f"pp={pp}: more stages than the model's {analysis.layers} layers"
    if sp > 1 and (not analysis.heads or analysis.heads % (tp * sp) or analysis.seq_len % sp):
        return (
            f"sp={sp}: tp x sp = {tp * sp} must divide the {analysis.heads} heads and sp "
            f"the sequence of {analysis.seq_len}"
        )
    return None


def why_illegal_tied(analysis: ModelAnalysis, pp: int, stage: int, schedule: str) -> str | None:
    """A head tied to the embedding sits on the first and the last stage (on two ranks
    but under zbv, whose V puts both on rank 0); their gradients are summed in ZeRO's
    reduced gradients, which stage 1 keeps whole and stage 2 shards."""
    if pp > 1 and stage >= 2 and schedule != "zbv" and analysis.tied_head:
        return (
            f"zero_stage={stage} with pp={pp} {schedule}: the tied embedding and head sit on "
            "two stages, whose gradients ZeRO-2 shards before they are summed"
        )
    return None


def layouts(
    analysis: ModelAnalysis, cluster: Cluster, constraints: dict[str, Any]
) -> Iterator[tuple[int, int, int, int]]:
    """(dp, tp, pp, sp) of the world that the constraints allow (legality checked later)."""
    world = cluster.world
    for tp in allowed(constraints, "tp", divisors(min(world, cluster.per_node))):
        for pp in allowed(constraints, "pp", divisors(world // tp)):
            for sp in allowed(constraints, "sp", divisors(world // (tp * pp))):
                dp = world // (tp * pp * sp)
                if allowed(constraints, "dp", [dp]):
                    yield dp, tp, pp, sp


def zero_stages(hybrid: bool, constraints: dict[str, Any]) -> list[int]:
    return allowed(constraints, "zero_stage", (0, 1, 2) if hybrid else (0, 1, 2, 3))


def offloads(hybrid: bool, stage: int, constraints: dict[str, Any]) -> list[tuple[str, float]]:
    """(offload, fraction) pairs, no offload first."""
    options: list[tuple[str, float]] = [("none", 0.0)]
    if stage >= 1:
        fractions = (1.0,) if hybrid else OFFLOAD_FRACTIONS
        options += [("host", f) for f in fractions]
    options = [o for o in options if allowed(constraints, "offload", [o[0]])]
    return [o for o in options if allowed(constraints, "offload_fraction", [o[1]])]


def schedules(pp: int, constraints: dict[str, Any]) -> list[str]:
    return allowed(constraints, "schedule", PIPELINE_SCHEDULES if pp > 1 else ("none",))
