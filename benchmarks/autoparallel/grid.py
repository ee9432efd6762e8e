"""Runs a grid of parallel configurations for real and records what each measured: the
median step time and the busiest rank's peak memory (one jsonl line per configuration,
written as soon as it finishes, so a killed run keeps the finished lines). Predictions
are a separate step (compare.py), so a grid measured on the lent GPU machine can be
compared anywhere later.

    # CPU ranks (world 4) on this machine, under the benchmark lock:
    flock /tmp/pytest.lock python benchmarks/autoparallel/grid.py --device cpu --preset cpu \
        --out benchmarks/results/autoparallel/<date>_cpu_grid.jsonl
    # one H200 (the lead's command; 1.3B-12B, bf16, ~8 minutes in all):
    python benchmarks/autoparallel/grid.py --device cuda --preset h200 \
        --out $OUT/<date>_h200_grid.jsonl
    # the GPU grid's code path on CPU with a tiny model (a smoke test):
    python benchmarks/autoparallel/grid.py --device cpu --preset h200-smoke --out /tmp/smoke.jsonl

Each configuration is its own `megalith run` job (grid_worker.py: the real Booster and
plugin), killed after --timeout seconds (its line then says so). --only NAME[,NAME]
runs a subset.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


@dataclass(frozen=True)
class Config:
    """One point of a grid (the fields grid_worker.py reads)."""

    name: str
    preset: str
    overrides: dict[str, Any] = field(default_factory=dict)
    seq_len: int = 128
    dp: int = 1
    tp: int = 1
    pp: int = 1
    sp: int = 1  # all_to_all sequence parallelism (Ulysses) beside tp
    zero_stage: int = 0
    offload_fraction: float = 0.0
    micro_batch: int = 1
    num_microbatches: int = 1
    ckpt: float = 0.0
    schedule: str = "none"
    precision: str = "fp32"
    steps: int = 3
    warmup: int = 2
    device: str = "cpu"
    timeout_s: int = 90

    @property
    def world(self) -> int:
        return self.dp * self.tp * self.pp * self.sp


#: the CPU grid's model: 8 layers of d256 (6.9M parameters), so a step of a few
#: sequences per rank takes 1-3 s on 4 ranks sharing 2 cores
CPU_MODEL = dict(d_model=256, n_layers=8, n_heads=8, d_ff=1024, vocab_size=2048, max_seq_len=256)


def cpu_grid() -> list[Config]:
    c = Config(name="", preset="gpt-tiny", overrides=CPU_MODEL, seq_len=128, dp=4, micro_batch=4)
    pipe = replace(c, micro_batch=2, num_microbatches=4, schedule="1f1b")
    return [
        replace(c, name="ddp"),
        replace(c, name="ddp_m2", micro_batch=2, num_microbatches=2),
        replace(c, name="ddp_ckpt", ckpt=1.0),
        replace(c, name="zero1", zero_stage=1),
        replace(c, name="zero2", zero_stage=2),
        replace(c, name="zero2_m2", zero_stage=2, micro_batch=2, num_microbatches=2),
        replace(c, name="zero2_offload", zero_stage=2, offload_fraction=1.0),
        replace(c, name="gemini", zero_stage=3),
        replace(c, name="gemini_ckpt", zero_stage=3, ckpt=0.5),
        replace(c, name="tp2_dp2", dp=2, tp=2),
        replace(c, name="tp4", dp=1, tp=4),
        replace(pipe, name="pp2_dp2", dp=2, pp=2),
        replace(pipe, name="pp4", dp=1, pp=4, num_microbatches=8),
        replace(pipe, name="tp2_pp2", dp=1, tp=2, pp=2),
        # ZB-V: the tied head sits on the embedding's rank, as ZeRO under a pipeline needs
        # search()'s own pick for this model at 2048 tokens a step (compare.py prints it)
        replace(
            pipe, name="zbv2_dp2_mb1", dp=2, pp=2, micro_batch=1, num_microbatches=8, schedule="zbv"
        ),
        replace(
            pipe, name="zbv2_dp2_zero1_ckpt", dp=2, pp=2, zero_stage=1, ckpt=1.0, schedule="zbv"
        ),
        # search()'s pick of 2026-12-02 (interleaved, 8 x 1), not measured then
        replace(
            pipe,
            name="int2_dp2_mb1",
            dp=2,
            pp=2,
            micro_batch=1,
            num_microbatches=8,
            schedule="interleaved",
        ),
        # all_to_all sequence parallelism (2026-12-04): beside dp, alone, beside tp
        replace(c, name="sp2_dp2", dp=2, sp=2),
        replace(c, name="sp4", dp=1, sp=4),
        replace(c, name="sp2_tp2", dp=1, tp=2, sp=2),
    ]


def h200_grid(model_scale: str = "full") -> list[Config]:
    """One H200, bf16, seq 2048: 1.3B to 12.2B under ZeRO-2/3, offload, checkpointing.
    Steps are chosen so the whole grid stays near 8 minutes (the 12B offloaded step
    takes 10-20 s); model_scale "smoke": the same configurations on a tiny model on CPU."""
    base = Config(
        name="",
        preset="gpt-1.3b",
        seq_len=2048,
        precision="bf16",
        device="cuda",
        steps=4,
        warmup=2,
        timeout_s=100,
    )
    big = dict(n_layers=38)  # gpt-13b cut to 38 layers: the 12.2B of ANCHORS
    grid = [
        replace(base, name="1p3b_zero2_mb8", zero_stage=2, micro_batch=8),
        replace(base, name="1p3b_zero2_mb16", zero_stage=2, micro_batch=16),
        replace(base, name="1p3b_zero3_mb8", zero_stage=3, micro_batch=8),
        replace(base, name="1p3b_zero2_mb8_m2", zero_stage=2, micro_batch=8, num_microbatches=2),
        replace(base, name="1p3b_zero2_mb16_ckpt", zero_stage=2, micro_batch=16, ckpt=1.0),
        replace(
            base, name="1p3b_zero2_off1_mb16", zero_stage=2, micro_batch=16, offload_fraction=1.0
        ),
        replace(
            base,
            name="6p7b_zero2_ckpt_mb8",
            preset="gpt-6.7b",
            zero_stage=2,
            micro_batch=8,
            ckpt=1.0,
            steps=3,
        ),
        replace(
            base,
            name="6p7b_gemini_off05_ckpt_mb8",
            preset="gpt-6.7b",
            zero_stage=3,
            micro_batch=8,
            ckpt=1.0,
            offload_fraction=0.5,
            steps=3,
            timeout_s=150,
        ),
        # 12.2B: 146 GB of fp32 masters and AdamW states; 60% of them on the host (88 GB
        # of the box's 125 GiB), bf16 shards, gradients and the rest on the GPU
        replace(
            base,
            name="12b_gemini_off06_ckpt_mb1",
            preset="gpt-13b",
            overrides=big,
            zero_stage=3,
            micro_batch=1,
            ckpt=1.0,
            offload_fraction=0.6,
            steps=2,
            warmup=1,
            timeout_s=280,
        ),
    ]
    if model_scale == "smoke":
        tiny = dict(CPU_MODEL, n_layers=2, d_model=64, n_heads=4, d_ff=256, vocab_size=512)
        grid = [
            replace(
                c,
                preset="gpt-tiny",
                overrides=tiny,
                seq_len=64,
                micro_batch=min(c.micro_batch, 2),
                precision="bf16",
                device="cpu",
                steps=2,
                warmup=1,
                timeout_s=60,
            )
            for c in grid
        ]
    return grid


PRESETS = {
    "cpu": cpu_grid,
    "h200": lambda: h200_grid("full"),
    "h200-smoke": lambda: h200_grid("smoke"),
}


def machine() -> dict[str, Any]:
    import torch

    info: dict[str, Any] = {"torch": torch.__version__, "cpus": os.cpu_count()}
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
    try:
        info["commit"] = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=HERE
        ).stdout.strip()
    except OSError:
        pass
    return info


def run_one(cfg: Config) -> dict[str, Any]:
    """Runs one configuration as its own job; its grid line (measured, or the failure)."""
    cmd = [
        sys.executable,
        "-m",
        "megalith",
        "run",
        "--nproc_per_node",
        str(cfg.world),
        str(HERE / "grid_worker.py"),
        json.dumps(asdict(cfg)),
    ]
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    if cfg.device == "cpu":
        env["OMP_NUM_THREADS"] = "1"
    start = time.perf_counter()
    line: dict[str, Any] = {"config": asdict(cfg)}
    try:
        proc = subprocess.run(
            cmd, capture_output=True, text=True, timeout=cfg.timeout_s, env=env, cwd=HERE
        )
    except subprocess.TimeoutExpired as exc:
        tail = (exc.stdout or b"")[-2000:]
        line.update(status="timeout", error=f"killed after {cfg.timeout_s} s", tail=str(tail))
        return line
    line["wall_s"] = round(time.perf_counter() - start, 1)
    # the launcher may prefix a rank's lines ("[rank0]:")
    found = [x.split("GRIDRESULT ", 1)[1] for x in proc.stdout.splitlines() if "GRIDRESULT " in x]
    if proc.returncode != 0 or not found:
        line.update(status="failed", rc=proc.returncode, tail=(proc.stdout + proc.stderr)[-3000:])
        return line
    line.update(status="ok", measured=json.loads(found[-1]))
    return line


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--preset", choices=sorted(PRESETS), default="cpu")
    ap.add_argument("--out", required=True, help="the jsonl to append one line per config to")
    ap.add_argument("--only", default="", help="comma-separated config names")
    ap.add_argument("--steps", type=int, default=0, help="timed steps (0: each config's)")
    a = ap.parse_args()
    grid = PRESETS[a.preset]()
    if a.device == "cpu":
        grid = [replace(c, device="cpu") for c in grid]
    elif any(c.device != "cuda" for c in grid):
        raise SystemExit(f"--device cuda: preset {a.preset!r} is a CPU grid; use --preset h200")
    if a.only:
        names = set(a.only.split(","))
        unknown = names - {c.name for c in grid}
        if unknown:
            raise SystemExit(f"--only: no configs {sorted(unknown)} in preset {a.preset!r}")
        grid = [c for c in grid if c.name in names]
    if a.steps:
        grid = [replace(c, steps=a.steps) for c in grid]
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    meta = machine()
    for cfg in grid:
        line = run_one(cfg)
        line["machine"] = meta
        line["date"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
        line["loadavg_1m"] = round(os.getloadavg()[0], 2)  # the box's load as it finished
        with out.open("a") as f:
            f.write(json.dumps(line) + "\n")
        got = line.get("measured", {})
        print(
            f"{cfg.name}: {line['status']} step {got.get('step_s', float('nan')):.3f} s "
            f"peak {got.get('peak_bytes', 0) / 2**20:.1f} MiB (wall {line.get('wall_s', '-')} s)",
            flush=True,
        )


if __name__ == "__main__":
    main()
