"""The cost of ZeroConfig(shard_each_param=True) on CPU ranks, beside the bucketed layout
and torch DDP, same models, same run.

LowLevelZeroPlugin shards every parameter as its own chunk (ColossalAI's per-parameter
master slices, which its scripts and tests read), so ZeRO-1/2 reduce, gather and step
once per parameter instead of once per ~12 MB bucket. This measures what that costs:
the step time of each layout at stages 1 and 2, on two GPTs from megalith.models:

- "wide":  gpt-tiny at d256, 4 blocks, 8192-token vocabulary (5.29 M params, 52 tensors;
  cpu_world2.py's model);
- "many":  d64, 16 blocks, 2048-token vocabulary (0.94 M params, 196 tensors: many
  small ones, the case where per-parameter collectives cost most).

    python benchmarks/zero/cpu_shard_each_param.py [--world 2] [--steps 10] [--out FILE.md]

Each (model, mode) runs in fresh rank processes, one thread each: warm-up steps, then
the median step time (forward + backward + optimizer step, AdamW, fp32) of the slowest
rank. The losses of both layouts are printed beside each other: they must match.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

import torch

from megalith.models import create, get_config

MODELS = {
    "wide": get_config("gpt-tiny", d_model=256, d_ff=1024, max_seq_len=128, vocab_size=8192),
    "many": get_config(
        "gpt-tiny", d_model=64, d_ff=256, n_layers=16, max_seq_len=128, vocab_size=2048
    ),
}
MODES = ["ddp", "zero1", "zero1-each", "zero2", "zero2-each"]


def bench(rank: int, model_name: str, mode: str, steps: int, warmup: int, batch: int):
    import megalith_comm as comm

    torch.set_num_threads(1)
    cfg = MODELS[model_name]
    model = create(cfg, device="cpu", seed=0)
    g = torch.Generator().manual_seed(rank)
    data = [
        torch.randint(0, cfg.vocab_size, (batch, cfg.max_seq_len + 1), generator=g)
        for _ in range(steps + warmup)
    ]
    if mode == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        net = DistributedDataParallel(model)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

        def backward(loss):
            loss.backward()

    else:
        import megalith_zero as zero

        config = zero.ZeroConfig(stage=int(mode[4]), shard_each_param=mode.endswith("-each"))
        net, opt = zero.shard(model, torch.optim.AdamW(model.parameters(), lr=1e-4), config)
        backward = opt.backward
    chunks = len(net.chunks) if hasattr(net, "chunks") else 0
    times, losses = [], []
    for i, tokens in enumerate(data):
        comm.barrier()
        t0 = time.perf_counter()
        logits = net(tokens[:, :-1])
        loss = torch.nn.functional.cross_entropy(
            logits.reshape(-1, cfg.vocab_size), tokens[:, 1:].reshape(-1)
        )
        backward(loss)
        opt.step()
        opt.zero_grad()
        t1 = time.perf_counter()
        losses.append(float(loss))
        if i >= warmup:
            times.append(t1 - t0)
    comm.barrier()
    return {
        "model": model_name,
        "mode": mode,
        "median_s": statistics.median(times),
        "chunks": chunks,
        "tensors": len(list(model.parameters())),
        "params": sum(p.numel() for p in model.parameters()),
        "last_loss": losses[-1],
    }


def main() -> None:
    from megalith.testing import run_distributed

    ap = argparse.ArgumentParser()
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    rows = []
    for model_name in a.models.split(","):
        for mode in a.modes.split(","):
            per_rank = run_distributed(
                bench, a.world, model_name, mode, a.steps, a.warmup, a.batch, timeout=1800
            )
            row = dict(per_rank[0], median_s=max(r["median_s"] for r in per_rank))
            rows.append(row)
            print(row, flush=True)
    lines = [
        f"# ZeroConfig(shard_each_param=True) against the bucketed layout: world {a.world}, "
        f"fp32, AdamW, batch {a.batch} x 128 per rank, {a.steps} timed steps",
        "",
        f"torch {torch.__version__}, {os.cpu_count()} CPUs, one thread per rank. Same run, "
        "fresh ranks per row. `-each`: every parameter its own chunk (LowLevelZeroPlugin's "
        "layout); without: the default ~12 MB chunks.",
        "",
        "| model | mode | chunks | step (s, median, slowest rank) | vs DDP | each / bucketed | last loss |",
        "|---|---|---|---|---|---|---|",
    ]
    by = {(r["model"], r["mode"]): r for r in rows}
    for r in rows:
        ddp = by.get((r["model"], "ddp"))
        base = by.get((r["model"], r["mode"].removesuffix("-each")))
        vs_ddp = f"{ddp['median_s'] / r['median_s']:.2f}x" if ddp else "-"
        ratio = (
            f"{r['median_s'] / base['median_s']:.2f}x"
            if base is not None and r["mode"].endswith("-each")
            else "-"
        )
        name = f"{r['model']} ({r['params'] / 1e6:.2f} M, {r['tensors']} tensors)"
        lines.append(
            f"| {name} | {r['mode']} | {r['chunks'] or '-'} | {r['median_s']:.4f} | {vs_ddp} "
            f"| {ratio} | {r['last_loss']:.6f} |"
        )
    lines += [
        "",
        "vs DDP: DDP's step time divided by this row's (above 1: faster than DDP). "
        "each / bucketed: the per-parameter layout's step time over the bucketed one's at "
        "the same stage (above 1: slower).",
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    if a.out:
        Path(a.out).write_text(text)


if __name__ == "__main__":
    main()
