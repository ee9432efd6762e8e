"""The cost model's predictions beside a measured grid (grid.py's jsonl): a markdown table
of predicted against measured step time and peak memory, the error of each, their median
and worst case, and which configuration each chooser would take.

    python benchmarks/autoparallel/compare.py ci_cpu benchmarks/results/autoparallel/<date>_cpu_grid.jsonl
    python benchmarks/autoparallel/compare.py h200 <date>_h200_grid.jsonl --gpus 1 > table.md

The last column is the box's 1-minute load average as each configuration finished
(grid.py records it; '-' for older grids).

PROFILE: a built-in profile name or a profile JSON (megalith calibrate). Memory is
compared on tensors: the prediction less the profile's not-tensor baseline
(memory.BASELINE_BYTES: the resident interpreter and libraries on CPU ranks; on CUDA the
workspaces outside torch's allocator) against the measured peak of live tensors
(grid_worker.py). Model state is also compared on its own, per kind, where the estimate
is exact (dp-only ZeRO: megalith_zero.estimate on the engine's chunk layout).

Choosers, each over the grid's configurations only, compared on measured tokens/s:
- the planner: the configuration with the highest predicted tokens/s whose predicted
  peak fits the device;
- ColossalAI's plugin guidance (docs/basics/booster_plugins, "Choosing your plugin"):
  TorchDDP below 2B parameters, LowLevelZero below 10B, Gemini above, HybridParallel
  (tp) above 60B; if the grid has no configuration of that plugin, the next one up. A
  user is taken to pick that plugin's best measured configuration (an upper bound of
  what the guidance gives).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from functools import cache
from pathlib import Path
from typing import Any

#: ColossalAI's guidance: parameter bounds and the plugin each range gets
GUIDANCE = ((2e9, "ddp"), (10e9, "zero"), (60e9, "gemini"), (float("inf"), "hybrid"))
PLUGIN_ORDER = ("ddp", "zero", "gemini", "hybrid")


def plugin_family(cfg: dict[str, Any]) -> str:
    if cfg["tp"] > 1 or cfg["pp"] > 1 or cfg.get("sp", 1) > 1:
        return "hybrid"
    return {0: "ddp", 1: "zero", 2: "zero", 3: "gemini"}[cfg["zero_stage"]]


@cache
def _model_and_analysis(preset: str, overrides: str, seq_len: int, precision: str):
    from megalith import models
    from megalith.autoparallel import analyze

    model = models.create(preset, device="meta", **json.loads(overrides))
    return model, analyze(model, seq_len, precision=precision)


def predict_line(cfg: dict[str, Any], cluster: Any) -> dict[str, Any]:
    """The cost model's figures for one grid configuration."""
    from megalith.autoparallel.cost import score
    from megalith.autoparallel.knobs import Knobs
    from megalith.autoparallel.memory import BASELINE_BYTES, peak_memory

    model, analysis = _model_and_analysis(
        cfg["preset"],
        json.dumps(cfg["overrides"], sort_keys=True),
        cfg["seq_len"],
        cfg["precision"],
    )
    frac = cfg["offload_fraction"]
    knobs = Knobs(
        dp=cfg["dp"],
        tp=cfg["tp"],
        pp=cfg["pp"],
        sp=cfg.get("sp", 1),
        zero_stage=cfg["zero_stage"],
        offload="host" if frac else "none",
        offload_fraction=frac,
        micro_batch=cfg["micro_batch"],
        num_microbatches=cfg["num_microbatches"],
        ckpt=cfg["ckpt"],
        schedule=cfg["schedule"],
        precision=cfg["precision"],
    )
    mem = peak_memory(analysis, cluster, knobs, model)
    cand = score(analysis, cluster, knobs, mem)
    baseline = BASELINE_BYTES.get(cluster.profile.device, BASELINE_BYTES["cuda"])
    state = mem.params + mem.grads + mem.grads_in_flight + mem.gathered + mem.optimizer
    return {
        "step_s": cand.predicted_step_s,
        "tokens_per_s": cand.predicted_tokens_per_s,
        "peak_bytes": mem.device,
        "tensor_bytes": mem.device - baseline,
        "state_bytes": state,
        "breakdown": cand.breakdown,
        "params": sum(p.numel() for p in {id(p): p for p in model.parameters()}.values()),
        "exact_state": cfg["zero_stage"] >= 1 and cfg["tp"] == cfg["pp"] == cfg.get("sp", 1) == 1,
    }


def measured_state(m: dict[str, Any]) -> int:
    """The busiest rank's measured model state (the engine's peaks, or the tensors)."""
    return max(sum(v for v in s.values()) for s in m["state_by_rank"])


def _err(pred: float, got: float) -> float:
    return (pred - got) / got


def _mib(n: float) -> str:
    return f"{n / 2**20:,.1f}"


def rows_of(lines: list[dict[str, Any]], cluster: Any) -> list[dict[str, Any]]:
    rows = []
    for line in lines:
        cfg = line["config"]
        if line.get("status") != "ok":
            rows.append({"cfg": cfg, "failed": line.get("status"), "why": line.get("error", "")})
            continue
        cfg = {**cfg, "load": line.get("loadavg_1m")}
        m, p = line["measured"], predict_line(cfg, cluster)
        tokens = cfg["dp"] * cfg["micro_batch"] * cfg["num_microbatches"] * cfg["seq_len"]
        rows.append(
            {
                "cfg": cfg,
                "m": m,
                "p": p,
                "tokens_per_s": tokens / m["step_s"],
                "step_err": _err(p["step_s"], m["step_s"]),
                "mem_err": _err(p["tensor_bytes"], m["peak_bytes"]),
                "state_err": _err(p["state_bytes"], measured_state(m)),
            }
        )
    return rows


def _summary(name: str, errs: list[float]) -> str:
    if not errs:
        return f"| {name} | - | - | - |"
    a = [abs(e) for e in errs]
    worst = max(errs, key=abs)
    return f"| {name} | {statistics.median(a):.1%} | {worst:+.1%} | {len(errs)} |"


def choices(rows: list[dict[str, Any]], device_bytes: float) -> list[str]:
    ok = [r for r in rows if "m" in r]
    if not ok:
        return ["no configuration ran"]
    best = max(ok, key=lambda r: r["tokens_per_s"])
    fits = [r for r in ok if r["p"]["peak_bytes"] <= device_bytes] or ok
    planner = max(fits, key=lambda r: r["p"]["tokens_per_s"])
    n = ok[0]["p"]["params"]
    wanted = next(plugin for bound, plugin in GUIDANCE if n < bound)
    guided, used = None, wanted
    for plugin in PLUGIN_ORDER[PLUGIN_ORDER.index(wanted) :]:
        mine = [r for r in ok if plugin_family(r["cfg"]) == plugin]
        if mine:
            guided, used = max(mine, key=lambda r: r["tokens_per_s"]), plugin
            break
    out = [
        "| chooser | configuration | measured tokens/s | of the best measured |",
        "|---|---|---|---|",
    ]
    picks = [("best measured", best), ("planner (cost model)", planner)]
    if guided is not None:
        note = "" if used == wanted else f", {wanted} not in the grid"
        picks.append((f"ColossalAI guidance ({n / 1e9:.2g}B params: {used}{note})", guided))
    for label, r in picks:
        ratio = r["tokens_per_s"] / best["tokens_per_s"]
        out.append(f"| {label} | {r['cfg']['name']} | {r['tokens_per_s']:,.0f} | {ratio:.1%} |")
    return out


_KNOBS = ("dp", "tp", "pp", "sp", "zero_stage", "offload_fraction", "micro_batch",
          "num_microbatches")  # fmt: skip


def searched(rows: list[dict[str, Any]], cluster: Any) -> list[str]:
    """search()'s own top plan for the model at the best measured configuration's global
    batch (the planner unrestricted), and whether the grid measured it."""
    from megalith.autoparallel.search import search

    ok = [r for r in rows if "m" in r]
    if not ok:
        return []
    best = max(ok, key=lambda r: r["tokens_per_s"])
    c = best["cfg"]
    model, analysis = _model_and_analysis(
        c["preset"], json.dumps(c["overrides"], sort_keys=True), c["seq_len"], c["precision"]
    )
    tokens = c["dp"] * c["micro_batch"] * c["num_microbatches"] * c["seq_len"]
    try:
        top = search(
            analysis, cluster, global_batch_tokens=tokens, precision=c["precision"], model=model
        )[0]
    except Exception as exc:  # NoFeasiblePlan, or a layout search() does not offer
        return ["", f"search() at {tokens} tokens a step: {type(exc).__name__}: {exc}"]
    plan = {k: getattr(top, k) for k in _KNOBS}
    same = [
        r
        for r in ok
        if {k: r["cfg"].get(k, 1) for k in _KNOBS} == plan  # grids before sp: sp 1
        and (r["cfg"]["ckpt"], r["cfg"]["schedule"]) == (top.ckpt, top.schedule)
    ]
    where = (
        f"measured as `{same[0]['cfg']['name']}`: {same[0]['tokens_per_s']:,.0f} tokens/s, "
        f"{same[0]['tokens_per_s'] / best['tokens_per_s']:.1%} of the best"
        if same
        else "not in the grid"
    )
    desc = ", ".join(f"{k}={v}" for k, v in plan.items()) + f", ckpt={top.ckpt}, {top.schedule}"
    return [
        "",
        f"search() unrestricted, at the best measured configuration's {tokens} tokens a step: "
        f"{desc} (predicted {top.predicted_tokens_per_s:,.0f} tokens/s); {where}.",
    ]


def table(
    rows: list[dict[str, Any]], profile_name: str, device_bytes: float, cluster: Any = None
) -> str:
    out = [
        f"Predictions from profile `{profile_name}`. Memory: predicted tensors (peak less the "
        "not-tensor baseline) against the measured live-tensor peak of the busiest rank; "
        "state: model state (params, grads, in flight, gathered, optimizer) per rank.",
        "",
        "| config | dp | tp | pp | zero | off | mb x m | ckpt | step meas. s | step pred. s "
        "| err | peak meas. MiB | pred. MiB | err | state meas. MiB | pred. MiB | err | load |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        c = r["cfg"]
        head = (
            f"| {c['name']} | {c['dp']} | {c['tp']} | {c['pp']} | {c['zero_stage']} | "
            f"{c['offload_fraction']:g} | {c['micro_batch']} x {c['num_microbatches']} | "
            f"{c['ckpt']:g} |"
        )
        if "m" not in r:
            out.append(head + f" {r['failed']}: {r['why']} |" + " |" * 9)
            continue
        m, p = r["m"], r["p"]
        exact = " (exact)" if p["exact_state"] else ""
        out.append(
            head + f" {m['step_s']:.3f} | {p['step_s']:.3f} | {r['step_err']:+.1%} | "
            f"{_mib(m['peak_bytes'])} | {_mib(p['tensor_bytes'])} | {r['mem_err']:+.1%} | "
            f"{_mib(measured_state(m))} | {_mib(p['state_bytes'])}{exact} | {r['state_err']:+.1%} | "
            f"{'-' if c.get('load') is None else c['load']} |"
        )
    ok = [r for r in rows if "m" in r]
    exact = [r for r in ok if r["p"]["exact_state"]]
    out += [
        "",
        "| figure | median abs. error | worst | configs |",
        "|---|---|---|---|",
        _summary("step time", [r["step_err"] for r in ok]),
        _summary("peak memory (tensors)", [r["mem_err"] for r in ok]),
        _summary("model state, exact estimate (dp-only ZeRO)", [r["state_err"] for r in exact]),
        _summary("model state, all", [r["state_err"] for r in ok]),
        "",
        *choices(rows, device_bytes),
        *(searched(rows, cluster) if cluster is not None else []),
    ]
    return "\n".join(out) + "\n"


def cluster_for(profile: str, lines: list[dict[str, Any]], gpus: int | None) -> Any:
    from megalith.autoparallel import Cluster, load_profile

    prof = load_profile(profile)
    world = max(
        (c["dp"] * c["tp"] * c["pp"] * c.get("sp", 1) for c in (ln["config"] for ln in lines)),
        default=1,
    )
    return Cluster(profile=prof, gpus_per_node=gpus or max(world, 1))


def load_lines(path: str | Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in Path(path).read_text().splitlines() if x.strip()]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("profile")
    ap.add_argument("grid", help="grid.py's jsonl")
    ap.add_argument(
        "--gpus", type=int, default=0, help="devices per node (default: the grid's world)"
    )
    a = ap.parse_args(argv)
    lines = load_lines(a.grid)
    cluster = cluster_for(a.profile, lines, a.gpus or None)
    device = cluster.device_memory_bytes or cluster.profile.device_memory_bytes
    sys.stdout.write(table(rows_of(lines, cluster), a.profile, device, cluster))


if __name__ == "__main__":
    main()
