"""The cost of ZeroConfig(shard_each_param=True) on CPU ranks, beside the bucketed layout
and torch DDP, same models, same run.

LowLevelZeroPlugin shards every parameter as its own chunk (ColossalAI's per-parameter
master slices, which its scripts and tests read). Its gradient reductions and parameter
gathers go a bucket of consecutive parameters at a time (megalith_zero/buckets.py;
before 2026-12-03 one collective per parameter). This measures what the layout costs:
the step time of each layout at stages 1 and 2, on two GPTs from megalith.models:

- "wide":  gpt-tiny at d256, 4 blocks, 8192-token vocabulary (5.29 M params, 52 tensors;
  cpu_world2.py's model);
- "many":  d64, 16 blocks, 2048-token vocabulary (0.94 M params, 196 tensors: many
  small ones, the case where per-parameter collectives cost most).

    python benchmarks/zero/cpu_shard_each_param.py [--world 2] [--steps 10] [--repeats 1]
        [--out FILE.md]

Modes: ddp; zeroS (the bucketed layout, one chunk for these models); zeroS-each
(shard_each_param with its default buckets: one for these models); zeroS-each1
(shard_each_param, chunk_bytes=1: one collective per parameter, as before buckets).
Each (model, mode) runs in fresh rank processes, one thread each: warm-up steps, then
the median step time (forward + backward + optimizer step, AdamW, fp32) of the slowest
rank; with --repeats R every mode of a model runs R times, the modes alternating, and
the median of the R medians is reported. The losses of all layouts are printed beside
each other: they must match.
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
MODES = ["ddp", "zero1", "zero1-each", "zero1-each1", "zero2", "zero2-each", "zero2-each1"]


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

        config = zero.ZeroConfig(
            stage=int(mode[4]),
            shard_each_param="-each" in mode,
            chunk_bytes=1 if mode.endswith("-each1") else 0,  # 1: a bucket per parameter
        )
        net, opt = zero.shard(model, torch.optim.AdamW(model.parameters(), lr=1e-4), config)
        backward = opt.backward
    chunks = len(net.chunks) if hasattr(net, "chunks") else 0
    # gradient collectives per backward: buckets (or chunks, before buckets existed)
    reducer = getattr(opt, "reducer", None)
    reductions = len(getattr(reducer, "units", getattr(reducer, "chunks", []))) if reducer else 0
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
        "reductions": reductions,
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
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--note", default="", help="a line for the header (the code measured)")
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    rows = []
    modes = a.modes.split(",")
    for model_name in a.models.split(","):
        runs: dict[str, list[dict]] = {m: [] for m in modes}
        for rep in range(a.repeats):
            for mode in modes if rep % 2 == 0 else modes[::-1]:
                per_rank = run_distributed(
                    bench, a.world, model_name, mode, a.steps, a.warmup, a.batch, timeout=1800
                )
                run = dict(per_rank[0], median_s=max(r["median_s"] for r in per_rank))
                runs[mode].append(run)
                print(run, flush=True)
        for mode in modes:
            times = [r["median_s"] for r in runs[mode]]
            rows.append(dict(runs[mode][0], median_s=statistics.median(times), times=times))
    lines = [
        f"# ZeroConfig(shard_each_param=True) against the bucketed layout: world {a.world}, "
        f"fp32, AdamW, batch {a.batch} x 128 per rank, {a.steps} timed steps, "
        f"{a.repeats} run(s) per mode",
        "",
        f"torch {torch.__version__}, {os.cpu_count()} CPUs, one thread per rank. Same run, "
        "fresh ranks per run, modes alternating. `-each`: every parameter its own chunk "
        "(LowLevelZeroPlugin's layout), with its default buckets; `-each1`: the same with "
        "chunk_bytes=1 (a bucket per parameter); without: the default chunks."
        + (f" {a.note}" if a.note else ""),
        "",
        "| model | mode | chunks | grad collectives | step (s, median of runs) | runs (s) "
        "| vs DDP | each / bucketed | last loss |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    by = {(r["model"], r["mode"]): r for r in rows}
    for r in rows:
        ddp = by.get((r["model"], "ddp"))
        vs_ddp = f"{ddp['median_s'] / r['median_s']:.2f}x" if ddp else "-"
        base = by.get((r["model"], r["mode"].split("-")[0]))
        ratio = (
            f"{r['median_s'] / base['median_s']:.2f}x"
            if base is not None and "-each" in r["mode"]
            else "-"
        )
        name = f"{r['model']} ({r['params'] / 1e6:.2f} M, {r['tensors']} tensors)"
        times = " ".join(f"{t:.3f}" for t in r["times"])
        lines.append(
            f"| {name} | {r['mode']} | {r['chunks'] or '-'} | {r['reductions'] or '-'} "
            f"| {r['median_s']:.4f} | {times} | {vs_ddp} | {ratio} | {r['last_loss']:.6f} |"
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
