"""Lent H200: a 1.3B GPT (seq 2048, bf16) at ZeRO stages 2 and 3 beside plain torch
(fp32 weights, bf16 autocast, fused AdamW; ../shared/ANCHORS.md: 58,651 tok/s at
micro-batch 16), same process, one after another.

    python benchmarks/zero/gpu_gpt.py --batch 16 --steps 8 --out benchmarks/results/zero_gpu_<date>.md
"""

from __future__ import annotations

import argparse
import gc
import time
from pathlib import Path

import torch

import megalith_comm as comm
from megalith import models


def run(mode: str, batch: int, seq: int, steps: int, warmup: int) -> dict:
    dev = torch.device("cuda")
    torch.cuda.reset_peak_memory_stats()
    model = models.create("gpt-1.3b", device=dev, seed=0)
    if mode == "torch":
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
        net = model

        def step(ids):
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = net(ids, labels=ids)[0]
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            return loss
    else:
        import megalith_zero as zero

        net, opt = zero.shard(
            model,
            torch.optim.AdamW(model.parameters(), lr=1e-4),
            zero.ZeroConfig(stage=int(mode[-1]), precision="bf16"),
        )

        def step(ids):
            loss = net(ids, labels=ids)[0]
            opt.backward(loss)
            opt.step()
            opt.zero_grad()
            return loss

    g = torch.Generator(device=dev).manual_seed(0)
    ids = torch.randint(0, 50257, (batch, seq), device=dev, generator=g)
    for _ in range(warmup):
        step(ids)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(steps):
        loss = step(ids)
    torch.cuda.synchronize()
    dt = (time.perf_counter() - t0) / steps
    out = {
        "mode": mode,
        "tokens_per_s": batch * seq / dt,
        "step_s": dt,
        "peak_gib": torch.cuda.max_memory_allocated() / 2**30,
        "loss": float(loss),
    }
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    comm.init()
    rows = []
    for m in ("torch", "zero2", "zero3"):
        rows.append(run(m, a.batch, a.seq, a.steps, a.warmup))
        gc.collect()
        torch.cuda.empty_cache()
    base = rows[0]["tokens_per_s"]
    lines = [
        f"# GPT 1.3B (d2048 L24 h16), seq {a.seq}, micro-batch {a.batch}, bf16, one H200",
        "",
        "| run | tokens/s | vs plain torch | step (s) | peak GPU memory (GiB) |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['mode']} | {r['tokens_per_s']:,.0f} | {r['tokens_per_s'] / base:.2f}x | "
            f"{r['step_s']:.3f} | {r['peak_gib']:.1f} |"
        )
    text = "\n".join(lines) + "\n"
    print(text)
    if a.out:
        Path(a.out).write_text(text)


if __name__ == "__main__":
    main()
