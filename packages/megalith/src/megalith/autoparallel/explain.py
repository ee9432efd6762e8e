"""The planner's reasons: one line for the winner, one per family of plans it beat or
that could not run (no plan of the family fits, or its layouts are illegal here)."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from .knobs import Knobs
from .memory import Memory
from .types import Candidate, Cluster, ModelAnalysis

GB = 1e9
#: how far "how many devices would fit" looks: the nodes doubled this many times
MAX_DOUBLINGS = 12
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
    "tp_sp_comm": "tp's all-reduces and sp's all-to-alls and gradient all-reduces",
    "split_backward": "the split backward's W calls",
    "pipeline_passes": "the pipeline passes' fixed cost",
    "pipeline_handoffs": "the pipeline hand-overs' waits",
    "pp_bubble_and_p2p": "the bubble",
    "dp_reduce": "the exposed gradient reduction",
    "zero3_gather": "stage 3's exposed gathers",
    "optimizer": "the optimizer step",
    "param_gather": "the parameter all-gather",
    "host_step": "the host step",
}


def _gb_up(nbytes: float) -> str:
    """GB rounded up (a figure to give back as a budget must not fall short)."""
    gb = nbytes / GB
    return f"{math.ceil(gb)}" if gb >= 100 else f"{math.ceil(gb * 10) / 10:.1f}"


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
    """What the search saw but could not keep: illegal layouts, plans over the budget.
    budget and host_budget: usable bytes per device and per rank on the host; headroom:
    the usable share of the device (to say what device would do)."""

    budget: int
    host_budget: int = 0
    headroom: float = 0.9
    precision: str = "bf16"
    reasons: list[str] = field(default_factory=list)
    smallest: tuple[int, Knobs, Memory] | None = None  # least device need over the budget
    host_bound: tuple[int, Knobs, Memory] | None = None  # fits the device, not the host
    too_big_count: int = 0
    smallest_without_sp: int = 0  # least device need of a plan with sp = 1 over the budget

    def illegal(self, why: str) -> None:
        if why not in self.reasons:
            self.reasons.append(why)

    def too_big(self, k: Knobs, m: Memory) -> None:
        self.too_big_count += 1
        if k.sp == 1 and m.device > self.budget:
            self.smallest_without_sp = min(self.smallest_without_sp or m.device, m.device)
        if m.device > self.budget:
            if self.smallest is None or m.device < self.smallest[0]:
                self.smallest = (m.device, k, m)
        elif self.host_bound is None or m.host < self.host_bound[0]:
            self.host_bound = (m.host, k, m)

    def no_plan(self, analysis: ModelAnalysis, cluster: Cluster, constraints: dict) -> Exception:
        from .search import NoFeasiblePlan

        fixed = ", ".join(f"{k}={v}" for k, v in constraints.items())
        relax = f" (or relax the constraint(s) {fixed})" if fixed else ""
        # the heads' divisibility first: it is what a device count gets wrong
        ruled_out = "; ".join(sorted(self.reasons, key=lambda r: "heads" not in r)[:4])
        if self.smallest is None and self.host_bound is None:
            return NoFeasiblePlan(
                f"no legal plan for {analysis.model} on {cluster.world} devices"
                + (f" under the constraint(s) {fixed}" if fixed else "")
                + f": {ruled_out or 'no layout of the world is legal'}; "
                + ("drop or change the constraint" if fixed else "change the device count")
            )
        also = f"; also ruled out: {ruled_out}" if ruled_out else ""
        more = self._devices_to_fit(analysis, cluster)
        if self.host_bound is not None and (
            self.smallest is None or self.host_bound[2].device <= self.budget
        ):
            host, k, m = self.host_bound
            per_node = host * cluster.per_node / self.headroom
            return NoFeasiblePlan(
                f"{analysis.model} fits nowhere on {cluster.world} devices: the closest plan "
                f"({describe(k)}) fits the device ({m.device / GB:.1f} of {self.budget / GB:.1f} "
                f"GB usable) but keeps {host / GB:.1f} GB per rank on the host, over the "
                f"{self.host_budget / GB:.1f} GB usable per rank; the knob that gets closest is "
                f"host memory: give at least {_gb_up(per_node)} GB per node (--host-gb)"
                + (f", or {more}" if more else "")
                + relax
                + also,
                smallest_bytes=m.device,
                closest=describe(k),
            )
        need, k, m = self.smallest  # type: ignore[misc]
        state = m.params + m.grads + m.grads_in_flight + m.gathered + m.optimizer
        return NoFeasiblePlan(
            f"{analysis.model} fits nowhere on {cluster.world} devices of "
            f"{self.budget / GB:.1f} GB usable: the smallest plan ({describe(k)}) needs "
            f"{need / GB:.1f} GB per device (model state {state / GB:.1f} GB, activations "
            f"{m.activations / GB:.1f} GB); the knob that gets closest: "
            + self._advice(analysis, need, m, more)
            + relax
            + also,
            smallest_bytes=need,
            closest=describe(k),
        )

    def _advice(self, analysis: ModelAnalysis, need: int, m: Memory, more: str) -> str:
        device = f"a device of at least {_gb_up(need / self.headroom)} GB (--gpu-gb)"
        if more:
            return f"{more}, or {device}"
        if m.activations > m.params + m.grads + m.optimizer:
            return (
                f"{device}; more devices do not help: the activations of one sequence of "
                f"{analysis.seq_len} with every layer checkpointed do not shrink with dp, so "
                "shorten the sequence (--seq-len) or give tp or sp a device count that divides "
                f"the {analysis.heads} heads"
            )
        return device

    def _devices_to_fit(self, analysis: ModelAnalysis, cluster: Cluster) -> str:
        """'N devices (the plan)' for the fewest doublings of the nodes at which the most
        frugal plan of a layout fits, or "" when none up to 2^MAX_DOUBLINGS does."""
        from . import space
        from .memory import peak_memory

        for i in range(1, MAX_DOUBLINGS + 1):
            bigger = replace(cluster, nodes=cluster.nodes * 2**i)
            for dp, tp, pp, sp in space.layouts(analysis, bigger, {"pp": 1}):
                if space.why_illegal_layout(analysis, bigger, tp, pp, sp):
                    continue
                k = Knobs(
                    dp=dp,
                    tp=tp,
                    sp=sp,
                    zero_stage=2 if tp * sp > 1 else 3,
                    offload="host",
                    offload_fraction=1.0,
                    ckpt=1.0,
                    precision=self.precision,
                )
                m = peak_memory(analysis, bigger, k)
                if m.device <= self.budget and m.host <= self.host_budget:
                    return (
                        f"{bigger.world} devices ({bigger.nodes} nodes of {bigger.per_node}: "
                        f"{describe(k)} fits)"
                    )
        return ""


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


def _why_sp(
    winner: Candidate,
    record: Record,
    pool: list[tuple[float, int, Knobs, Memory]],
    scorer: Callable[[Knobs, Memory], Candidate],
) -> str:
    """The winner line's clause on its sequence parallelism: the plans without it do not
    fit, fit only by recomputing or offloading, or are slower."""
    sp = winner.sp
    without = sorted((e for e in pool if e[2].sp == 1), key=lambda e: e[0])[:3]
    if not without:
        need = record.smallest_without_sp
        return (
            f"; sp{sp} because no plan without sequence parallelism fits: splitting each "
            f"sequence over {sp} ranks divides the layers' activations by {sp}"
            + (f" (without it the smallest plan needs {need / GB:.2f} GB)" if need else "")
        )
    best = min((scorer(k, m) for _, _, k, m in without), key=lambda c: c.predicted_step_s)
    ratio = best.predicted_step_s / winner.predicted_step_s
    if best.ckpt or best.offload != "none":
        how = " and ".join(
            w
            for w, on in (("recomputing", best.ckpt), ("offloading", best.offload != "none"))
            if on
        )
        return (
            f"; sp{sp} because without it the plans fit only by {how}: splitting each sequence "
            f"over {sp} ranks divides the layers' activations by {sp}; the best without sp "
            f"({describe(best)}) takes {ratio:.2f}x as long"
        )
    return f"; sp{sp}: without sequence parallelism {_why_slower(best, winner)}"


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
        + (_why_sp(winner, record, pool, scorer) if winner.sp > 1 else "")
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
