"""The planner's reasons: one line for the winner, one per family of plans it beat or
that could not run (no plan of the family fits, or its layouts are illegal here)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from .knobs import Knobs
from .memory import Memory
from .types import Candidate, Cluster, ModelAnalysis

GB = 1e9
_NONE_FITS = "no plan of it is legal here or fits the budget"
#: families the search drops where a plan without them fits at the same micro-batch
_NOT_NEEDED = {
    "ckpt>0": "not needed: the plans fit without it, and it only adds recompute",
    "offload": "not needed: the plans fit without it, and it only adds host work",
}
#: the families a plan belongs to (a plan may be in several), and the test of each
FAMILIES: dict[str, Callable[[Any], bool]] = {
    "pp>1": lambda c: c.pp > 1,
    "tp>1": lambda c: c.tp > 1,
    "sp>1": lambda c: c.sp > 1,
    "zero3": lambda c: c.zero_stage == 3,
    "offload": lambda c: c.offload != "none",
    "ckpt>0": lambda c: c.ckpt > 0,
    "data parallel only": lambda c: c.tp == c.pp == c.sp == 1,
}
#: breakdown keys as the reasons name them
PART_NAMES = {
    "compute": "compute",
    "recompute": "recompute",
    "tp_comm": "tp's all-reduces",
    "tp_sp_comm": "tp's all-reduces and sp's all-to-alls",
    "pp_bubble_and_p2p": "the bubble",
    "dp_reduce": "the exposed gradient reduction",
    "zero3_gather": "stage 3's exposed gathers",
    "optimizer": "the optimizer step",
    "param_gather": "the parameter all-gather",
    "host_step": "the host step",
}


def describe(c: Any) -> str:
    """dp8 tp2 pp1 zero1 mb4x2 ckpt0.5 ..."""
    text = f"dp{c.dp} tp{c.tp} pp{c.pp}"
    if c.sp > 1:
        text += f" sp{c.sp}"
    text += f" zero{c.zero_stage} mb{c.micro_batch}x{c.num_microbatches}"
    if c.ckpt:
        text += f" ckpt{c.ckpt:g}"
    if c.offload != "none":
        text += f" offload {c.offload} {c.offload_fraction:g}"
    if c.pp > 1:
        text += f" {c.schedule}"
    return text


@dataclass
class Record:
    """What the search saw but could not keep: illegal layouts, plans over the budget."""

    budget: int
    reasons: list[str] = field(default_factory=list)
    smallest: tuple[int, Knobs, Memory] | None = None
    too_big_count: int = 0

    def illegal(self, why: str) -> None:
        if why not in self.reasons:
            self.reasons.append(why)

    def too_big(self, k: Knobs, m: Memory) -> None:
        self.too_big_count += 1
        if self.smallest is None or m.device < self.smallest[0]:
            self.smallest = (m.device, k, m)

    def no_plan(self, analysis: ModelAnalysis, cluster: Cluster, constraints: dict) -> Exception:
        from .search import NoFeasiblePlan

        fixed = ", ".join(f"{k}={v}" for k, v in constraints.items())
        if self.smallest is None:
            why = "; ".join(self.reasons[:4]) or "no layout of the world is legal"
            return NoFeasiblePlan(
                f"no legal plan for {analysis.model} on {cluster.world} devices"
                + (f" under the constraint(s) {fixed}" if fixed else "")
                + f": {why}; drop or change the constraint"
            )
        need, k, m = self.smallest
        closest = describe(k)
        return NoFeasiblePlan(
            f"{analysis.model} fits nowhere on {cluster.world} devices of "
            f"{self.budget / GB:.1f} GB usable: the smallest plan ({closest}) needs "
            f"{need / GB:.1f} GB per device (model state "
            f"{(m.params + m.grads + m.grads_in_flight + m.gathered + m.optimizer) / GB:.1f} GB, "
            f"activations {m.activations / GB:.1f} GB); that is the knob that gets closest: "
            "add devices, offload to host, or a larger device"
            + (f" (or relax {fixed})" if fixed else ""),
            smallest_bytes=need,
            closest=closest,
        )


def _why_slower(c: Candidate, winner: Candidate) -> str:
    extra = {
        k: c.breakdown.get(k, 0.0) - winner.breakdown.get(k, 0.0)
        for k in set(c.breakdown) | set(winner.breakdown)
    }
    part = max(extra, key=lambda k: extra[k])
    share = c.breakdown.get(part, 0.0) / c.predicted_step_s
    saved = min(extra, key=lambda k: extra[k])
    against = f" costs more than {PART_NAMES.get(saved, saved)} saves" if extra[saved] < 0 else ""
    return (
        f"{PART_NAMES.get(part, part)} {share:.0%}{against}: its best ({describe(c)}) "
        f"{c.predicted_step_s / winner.predicted_step_s:.2f}x the winner's step"
    )


def annotate(
    ranked: list[Candidate],
    record: Record,
    pool: list[tuple[float, int, Knobs, Memory]],
    scorer: Callable[[Knobs, Memory], Candidate],
) -> list[Candidate]:
    """The ranked list with reasons: the winner's first line, then one per family."""
    winner = ranked[0]
    lines = [
        f"winner {describe(winner)}: {winner.predicted_step_s * 1e3:.1f} ms a step, "
        f"{winner.predicted_mfu:.0%} MFU, peak {winner.predicted_peak_bytes / GB:.1f} of "
        f"{record.budget / GB:.1f} GB"
        + (
            f"; the runner-up is {ranked[1].predicted_step_s / winner.predicted_step_s - 1:.1%} "
            "slower"
            if len(ranked) > 1
            else ""
        )
    ]
    for family, member in FAMILIES.items():
        if member(winner):
            continue
        mine = sorted((e for e in pool if member(e[2])), key=lambda e: e[0])[:3]
        if not mine:
            lines.append(f"{family}: {_NOT_NEEDED.get(family, _NONE_FITS)}")
            continue
        best = min((scorer(k, m) for _, _, k, m in mine), key=lambda c: c.predicted_step_s)
        lines.append(f"{family}: {_why_slower(best, winner)}")
    reasons = [replace(ranked[0], reason="\n".join(lines))]
    return reasons + [replace(c, reason=f"{describe(c)}") for c in ranked[1:]]
