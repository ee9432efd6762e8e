"""Loss parity of adamw's lean states (issue 20): `megalith train` runs of one model, data
and schedule with --optim-state-dtype fp32, bf16 and int8, compared step for step.

    python benchmarks/optim/lean_state_parity.py RUNS_DIR --names parity_fp32,parity_bf16,\
parity_int8 --out benchmarks/results/optim_cpu/<date>_<machine>_lean_state_parity.md

Each run is RUNS_DIR/<name>/metrics.jsonl (one row per step; validation rows carry
val_loss). The first name is the reference. Runs stopped early (--max-time) are compared
up to the last step every run reached: the schedule is the same, so the curves are too.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

#: train losses are averaged over this many steps before they are compared
WINDOW = 50


def read(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def window_mean(rows: list[dict], end: int) -> float:
    losses = [r["loss"] for r in rows if end - WINDOW < r["step"] <= end]
    return sum(losses) / len(losses)


def diverged(rows: list[dict], ref: list[dict]) -> bool:
    """A non-finite loss, or a window mean 10% above the reference's at the same step."""
    if not all(math.isfinite(r["loss"]) for r in rows):
        return True
    last = min(rows[-1]["step"], ref[-1]["step"])
    return any(
        window_mean(rows, s) > 1.1 * window_mean(ref, s) for s in range(WINDOW, last + 1, WINDOW)
    )


def table(runs: dict[str, list[dict]]) -> str:
    names = list(runs)
    ref = runs[names[0]]
    common = min(rows[-1]["step"] for rows in runs.values())
    marks = [s for s in (250, 500, 750, 1000, 1250, 1500, 1750, 2000) if s <= common]
    if not marks or marks[-1] != common:
        marks.append(common)
    lines = [
        f"Train loss, mean of the {WINDOW} steps up to each step (nats per byte):",
        "",
        "| step | " + " | ".join(names) + " |",
        "|---|" + "---|" * len(names),
    ]
    for s in marks:
        cells = []
        for n in names:
            value = window_mean(runs[n], s)
            rel = value / window_mean(ref, s) - 1
            cells.append(f"{value:.4f}" + ("" if n == names[0] else f" ({rel:+.2%})"))
        lines.append(f"| {s} | " + " | ".join(cells) + " |")
    lines += ["", "Validation loss (the runs' own evaluations):", ""]
    lines += ["| step | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    val_steps = sorted(
        {r["step"] for r in ref if "val_loss" in r and r["step"] <= common}
        & set.intersection(
            *({r["step"] for r in rows if "val_loss" in r} for rows in runs.values())
        )
    )
    for s in val_steps:
        vals = [
            next(r["val_loss"] for r in runs[n] if r["step"] == s and "val_loss" in r)
            for n in names
        ]
        lines.append(f"| {s} | " + " | ".join(f"{v:.4f}" for v in vals) + " |")
    lines += [
        "",
        f"| run | steps reached | final loss vs reference (at step {common}) | diverged |",
        "|---|---|---|---|",
    ]
    for n in names:
        rel = window_mean(runs[n], common) / window_mean(ref, common) - 1
        lines.append(
            f"| {n} | {runs[n][-1]['step']} | {rel:+.2%} | {'yes' if diverged(runs[n], ref) else 'no'} |"
        )
    return "\n".join(lines) + "\n"


def plot(runs: dict[str, list[dict]], path: str) -> None:
    """The train losses (WINDOW-step means) of every run on one figure (matplotlib)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for name, rows in runs.items():
        steps = list(range(WINDOW, rows[-1]["step"] + 1, 10))
        ax.plot(steps, [window_mean(rows, s) for s in steps], label=name, lw=1)
    ax.set_xlabel("step")
    ax.set_ylabel(f"train loss ({WINDOW}-step mean, nats)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("runs_dir")
    ap.add_argument("--names", default="parity_fp32,parity_bf16,parity_int8")
    ap.add_argument("--out", default="")
    ap.add_argument("--png", default="", help="the curves on one figure (matplotlib)")
    ap.add_argument("--title", default="# Lean Adam states: loss parity")
    a = ap.parse_args()
    runs = {n: read(Path(a.runs_dir) / n / "metrics.jsonl") for n in a.names.split(",")}
    text = a.title + "\n\n" + table(runs)
    print(text)
    if a.out:
        Path(a.out).write_text(text)
    if a.png:
        plot(runs, a.png)


if __name__ == "__main__":
    main()
