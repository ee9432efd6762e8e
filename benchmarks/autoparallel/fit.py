"""Fits the cost model's free constants to a measured grid, each on the configurations
that isolate it, and reports the error on every configuration (the others are held out).

    python benchmarks/autoparallel/fit.py ci_cpu benchmarks/results/autoparallel/<date>_cpu_grid.jsonl

Fitted, in order (each by a scan that minimises the median |log(predicted / measured)|
step time over its fit set):
1. compute.COMPUTE_EFFICIENCY[device]: on the DDP configurations (data parallelism with
   one gradient bucket or two: compute dominates, the reduction is one collective);
2. cost.DP_OVERLAP[transport] and cost.ZERO3_OVERLAP[transport], one value (the share
   of compute a collective hides under on this transport): on the dp-only ZeRO
   configurations (stages 1-3), whose reductions are many collectives under backward;
3. cost.TP_SYNC_S[transport]: on the tensor-parallel configurations.
Pipelines without tp are held out. The scans go round twice (each
constant moves the others' fit sets a little).
It prints the values and the held-out errors; the values go into the sources by hand,
with the results file named beside them.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import compare


def _log_err(rows: list[dict[str, Any]]) -> float:
    return statistics.median(abs(math.log1p(r["step_err"])) for r in rows) if rows else 0.0


def scan(
    set_value: Callable[[float], None],
    values: list[float],
    lines: list[dict[str, Any]],
    cluster: Any,
) -> tuple[float, float]:
    """(best value, its median |log error|) over `lines`; with no lines, the current value
    is kept (returned as nan: not fitted)."""
    if not lines:
        return float("nan"), float("nan")
    best = (values[0], float("inf"))
    for v in values:
        set_value(v)
        err = _log_err([r for r in compare.rows_of(lines, cluster) if "m" in r])
        if err < best[1]:
            best = (v, err)
    set_value(best[0])
    return best


def is_ddp(cfg: dict[str, Any]) -> bool:
    return cfg["zero_stage"] == 0 and cfg["tp"] == cfg["pp"] == 1


def is_dp_zero(cfg: dict[str, Any]) -> bool:
    return cfg["zero_stage"] >= 1 and cfg["tp"] == cfg["pp"] == 1


def is_tp(cfg: dict[str, Any]) -> bool:
    return cfg["tp"] > 1


def main(argv: list[str] | None = None) -> None:
    from megalith.autoparallel import compute, cost

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("profile")
    ap.add_argument("grid")
    a = ap.parse_args(argv)
    lines = [ln for ln in compare.load_lines(a.grid) if ln.get("status") == "ok"]
    cluster = compare.cluster_for(a.profile, lines, None)
    device, transport = cluster.profile.device, cluster.profile.transport

    def set_eff(v: float) -> None:
        compute.COMPUTE_EFFICIENCY[device] = v

    def set_overlap(v: float) -> None:
        cost.DP_OVERLAP[transport] = cost.ZERO3_OVERLAP[transport] = v

    def set_sync(v: float) -> None:
        cost.TP_SYNC_S[transport] = v

    ddp = [ln for ln in lines if is_ddp(ln["config"])]
    zero = [ln for ln in lines if is_dp_zero(ln["config"])]
    tp = [ln for ln in lines if is_tp(ln["config"])]
    syncs = [i * 0.5e-3 for i in range(41)]
    effs = [round(0.05 * 1.05**i, 4) for i in range(64) if 0.05 * 1.05**i <= 1.0]
    for _ in range(2):  # DDP's reduction overlaps too: scan each with the other's value
        eff, e1 = scan(set_eff, effs, ddp, cluster)
        overlap, e2 = scan(set_overlap, [i / 20 for i in range(21)], zero, cluster)
        sync, e3 = scan(set_sync, syncs, tp, cluster)
    print(f"COMPUTE_EFFICIENCY[{device!r}] = {eff}  (median |log err| {e1:.3f} on {len(ddp)})")
    print(
        f"DP_OVERLAP = ZERO3_OVERLAP[{transport!r}] = {overlap}  (median |log err| {e2:.3f} on {len(zero)})"
    )
    print(f"TP_SYNC_S[{transport!r}] = {sync:g}  (median |log err| {e3:.3f} on {len(tp)})")
    fit_names = {ln["config"]["name"] for ln in ddp + zero + tp}
    for r in compare.rows_of(lines, cluster):
        role = "fit" if r["cfg"]["name"] in fit_names else "held out"
        print(
            f"  {r['cfg']['name']:24s} {role:9s} step {r['step_err']:+.1%}  peak {r['mem_err']:+.1%}"
        )


if __name__ == "__main__":
    main()
