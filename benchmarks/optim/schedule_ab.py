#!/usr/bin/env python3
"""The host AdamW step's thread split against torch's fused AdamW, interleaved in one process.

usage: schedule_ab.py [LOG2N=26] [THREADS=2] [ROUNDS=40] [VARIANTS=auto,blocked,interleaved]

Each round times one torch._fused_adamw_ step, then one megalith step per variant, on
their own buffers of 2^LOG2N fp32 elements (p, g, m, v), so load changes on a shared
machine hit every variant alike. Variants: "auto" (MEGALITH_CPU_SCHEDULE unset: the
engine measures both splits at its first large steps and keeps the faster), "blocked",
"interleaved" (forced); "+avx2" / "+scalar" suffixes force a SIMD level. Prints the
median and best per variant, torch's median over each variant's (>1: megalith faster), and
the median of the per-round ratios (paired: both timed within the same round's load).
The order is shuffled each round: the step right after torch's runs beside torch's
OpenMP threads still spinning, whichever it is.
"""

from __future__ import annotations

import os
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch
from bench_cpu_step import HP, Setup, engine


def main() -> None:
    args = sys.argv[1:]
    log2n = int(args[0]) if args else 26
    threads = int(args[1]) if len(args) > 1 else 2
    rounds = int(args[2]) if len(args) > 2 else 40
    variants = (args[3] if len(args) > 3 else "auto,blocked,interleaved").split(",")
    e = engine()
    torch.set_num_threads(threads)
    e.set_num_threads(threads)
    n = 1 << log2n
    ours = Setup("megalith", n)
    gen = torch.Generator().manual_seed(1)
    tp, tg = torch.randn(n, generator=gen), torch.randn(n, generator=gen).mul_(1e-2)
    tm, tv = torch.randn(n, generator=gen).mul_(1e-3), torch.rand(n, generator=gen).mul_(1e-5)
    step = torch.tensor(0.0)

    def torch_step() -> None:
        step.add_(1)
        torch._fused_adamw_([tp], [tg], [tm], [tv], [], [step], lr=HP["lr"], beta1=0.9,
                            beta2=0.999, weight_decay=HP["weight_decay"], eps=HP["eps"],
                            amsgrad=False, maximize=False)  # fmt: skip

    def use(variant: str) -> None:
        e.force_simd_level(None)
        os.environ.pop("MEGALITH_CPU_SCHEDULE", None)
        for part in variant.split("+"):
            if part in ("blocked", "interleaved"):
                os.environ["MEGALITH_CPU_SCHEDULE"] = part
            elif part in ("avx2", "scalar", "avx512"):
                e.force_simd_level(part)

    times: dict[str, list[float]] = {"torch fused": [], **{v: [] for v in variants}}
    for _ in range(8):  # warm-up; "auto" measures its splits in these
        torch_step()
        for v in variants:
            use(v)
            ours.step()
    use("auto")
    chosen = e.cpu_step_schedule()
    order, shuffle = ["torch fused", *variants], random.Random(0).shuffle
    for _ in range(rounds):  # shuffled: the step right after torch's competes with its
        shuffle(order)  # still spinning OpenMP threads
        for name in order:
            if name == "torch fused":
                t0 = time.perf_counter()
                torch_step()
            else:
                use(name)
                t0 = time.perf_counter()
                ours.step()
            times[name].append(time.perf_counter() - t0)
    base = statistics.median(times["torch fused"])
    print(f"log2n={log2n} threads={threads} rounds={rounds} simd={e.simd_level()} "
          f"auto chose {chosen} load={os.getloadavg()[0]:.2f}")  # fmt: skip
    print(
        "| variant | median ms | best ms | torch fused / variant (medians) | (paired, per round) |"
    )
    print("|---|---|---|---|---|")
    for name, xs in times.items():
        m = statistics.median(xs)
        paired = statistics.median(t / x for t, x in zip(times["torch fused"], xs))
        print(f"| {name} | {m * 1e3:.2f} | {min(xs) * 1e3:.2f} | {base / m:.3f} | {paired:.3f} |")


if __name__ == "__main__":
    main()
