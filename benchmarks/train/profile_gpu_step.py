"""Where a `megalith train` step's time goes on one GPU, beside plain torch on the same
model and batch (the step of `megalith train --plugin ddp --precision bf16` ran at 5% MFU
at 1.3B on the H200, 2026-12-03).

    python benchmarks/train/profile_gpu_step.py --model gpt-1.3b --batch 8 --seq 1024

Prints: plain torch's median step (bf16 autocast over fp32 weights, fused AdamW), then
`megalith train`'s steps under torch.profiler with the ops that take the most GPU and CPU
time, and the time of each recorded region (forward, backward, optimizer step)."""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch


def plain_torch(model_name: str, batch: int, seq: int, steps: int) -> float:
    from megalith import models

    model = models.create(model_name, device="cuda", seed=0, vocab_size=256, max_seq_len=seq)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, fused=True)
    ids = torch.randint(0, 256, (batch, seq), device="cuda")
    times = []
    for _ in range(steps):
        torch.cuda.synchronize()
        t = time.perf_counter()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(ids, labels=ids)[0]
        loss.backward()
        opt.step()
        opt.zero_grad()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
    del model, opt
    torch.cuda.empty_cache()
    return statistics.median(times[2:])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="gpt-1.3b")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--out", default="/tmp/profile_runs")
    ap.add_argument("--skip-torch", action="store_true")
    ap.add_argument("train_args", nargs="*", help="more `megalith train` options")
    a = ap.parse_args()
    if not a.skip_torch:
        s = plain_torch(a.model, a.batch, a.seq, a.steps + 2)
        print(f"plain torch: {s * 1e3:.0f} ms/step, {a.batch * a.seq / s:.0f} tok/s", flush=True)
    os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1")
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29533")
    from torch.profiler import ProfilerActivity, profile

    from megalith.train.__main__ import main as train_main

    argv = ["--model", a.model, "--precision", "bf16", "--plugin", "ddp", "--steps",
            str(a.steps), "--batch-size", str(a.batch), "--seq-len", str(a.seq),
            "--eval-every", "100000", "--save-every", "100000", "--out", a.out,
            "--overwrite", *a.train_args]  # fmt: skip
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        train_main(argv)
    table = prof.key_averages()
    print(table.table(sort_by="self_cuda_time_total", row_limit=25, max_name_column_width=70))
    print(table.table(sort_by="self_cpu_time_total", row_limit=25, max_name_column_width=70))


if __name__ == "__main__":
    main()
