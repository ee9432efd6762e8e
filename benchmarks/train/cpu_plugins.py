"""`megalith train` tokens/s per plugin beside a plain torch DDP script, same 2 CPU ranks,
same run (alternating, so drift on the shared machine hits both).

    python benchmarks/train/cpu_plugins.py --steps 100 --rounds 2 --out benchmarks/results/train/<date>_cpu.md
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent


def megalith_train(plugin: str, steps: int, out: Path) -> float:
    cmd = [
        sys.executable,
        "-m",
        "megalith",
        "train",
        "--plugin",
        plugin,
        "--steps",
        str(steps),
        "--nproc",
        "2",
        "--eval-every",
        str(10**6),
        "--save-every",
        str(10**6),
        "--out",
        str(out),
        "--name",
        plugin,
    ]
    subprocess.run(cmd, check=True, capture_output=True, text=True)
    rows = [json.loads(x) for x in (out / plugin / "metrics.jsonl").read_text().splitlines()]
    steady = rows[5:-1]  # the last step validates and checkpoints
    return sum(r["tokens_per_s"] * r["step_s"] for r in steady) / sum(r["step_s"] for r in steady)


def plain(steps: int) -> float:
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        "2",
        str(HERE / "plain_ddp.py"),
        "--steps",
        str(steps),
    ]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(next(x for x in out.splitlines() if x.startswith("{")))["tokens_per_s"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--plugins", default="ddp,zero1,zero2,gemini")
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    plugins = a.plugins.split(",")
    got: dict[str, list[float]] = {p: [] for p in ["plain torch DDP", *plugins]}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(a.rounds):
            got["plain torch DDP"].append(plain(a.steps))
            for p in plugins:
                got[p].append(megalith_train(p, a.steps, Path(tmp) / f"r{r}"))
            print({k: round(v[-1]) for k, v in got.items()}, flush=True)
    base = statistics.median(got["plain torch DDP"])
    lines = [
        f"# `megalith train` throughput per plugin, 2 CPU ranks, gpt-tiny (fp32), batch 16 x 128 per rank, "
        f"{a.steps} steps x {a.rounds} rounds",
        "",
        "Tokens/s over the steady steps (after 5), median of the rounds; the peer is a plain torch DDP loop",
        "(torch.optim.AdamW) on the same model, data and clipping, run alternately in the same session.",
        "",
        "| run | tokens/s | vs plain torch DDP |",
        "|---|---|---|",
    ]
    for k, v in got.items():
        lines.append(f"| {k} | {statistics.median(v):,.0f} | {statistics.median(v) / base:.2f}x |")
    text = "\n".join(lines) + "\n"
    print(text)
    if a.out:
        Path(a.out).write_text(text)


if __name__ == "__main__":
    main()
