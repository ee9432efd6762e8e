"""Step time of a small Llama at tensor parallel 2 beside DDP on the same 2 CPU ranks.

    python benchmarks/tp/cpu_tp2.py [--steps 10] [--out benchmarks/results/tp/<date>_cpu.md]

One process group (2 Gloo ranks, one thread each) runs, step by step alternating so a
drift in the machine's load hits all alike: torch DDP (each rank half the batch, the
whole model), megalith tensor parallel 2 (each rank the whole batch, half of every
layer), and tp 2 with sequence parallelism. A step is forward, backward and AdamW on
the same global batch; the median over the timed steps is reported with tokens/s and
the ratio to DDP. On CPU, TP pays a collective per region per layer on activations
while DDP pays one gradient all-reduce: DDP is expected to win on this machine; the
figure that matters for TP (a layer too wide for one GPU) is memory, also shown.
"""

from __future__ import annotations

import argparse
import copy
import datetime as dt
import os
import platform
import statistics
import time
from pathlib import Path

import torch

BATCH, SEQ = 8, 256
CONFIG = dict(vocab_size=4096, max_seq_len=SEQ, d_model=256, n_layers=4, n_heads=8, n_kv_heads=4,
              d_ff=688)  # fmt: skip


def _rank(rank: int, steps: int, warmup: int) -> dict:
    import megalith.models as mm
    import megalith_comm as comm
    from megalith.tensor_parallel import shard_model

    torch.set_num_threads(1)
    world = comm.get_world()
    base = mm.create(mm.LlamaConfig(**CONFIG), device="cpu", seed=0)
    ids = torch.randint(
        0, CONFIG["vocab_size"], (BATCH, SEQ), generator=torch.Generator().manual_seed(0)
    )
    ddp = torch.nn.parallel.DistributedDataParallel(copy.deepcopy(base))
    tp_group = world.group
    runs = {
        "DDP (torch)": (ddp, ids.chunk(world.world_size)[rank]),
        "megalith tp 2": (shard_model(copy.deepcopy(base), tp_group), ids),
        "megalith tp 2 + SP": (
            shard_model(copy.deepcopy(base), tp_group, sequence_parallel=True),
            ids,
        ),
    }
    opts = {k: torch.optim.AdamW(m.parameters(), lr=1e-4) for k, (m, _) in runs.items()}
    times: dict[str, list[float]] = {k: [] for k in runs}
    losses: dict[str, float] = {}
    for i in range(warmup + steps):
        for name, (model, x) in runs.items():
            comm.barrier()
            t0 = time.perf_counter()
            loss = model(x, labels=x).loss
            loss.backward()
            opts[name].step()
            opts[name].zero_grad()
            comm.barrier()
            if i >= warmup:
                times[name].append(time.perf_counter() - t0)
            losses[name] = float(loss.detach())
    params = {k: sum(p.numel() for p in m.parameters()) for k, (m, _) in runs.items()}
    return {"times": times, "params": params, "losses": losses}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    from megalith.testing import run_distributed

    res = run_distributed(_rank, 2, args.steps, args.warmup, timeout=1200)
    r0 = res[0]
    tokens = BATCH * SEQ
    ddp = statistics.median(r0["times"]["DDP (torch)"])
    lines = [
        f"# Tensor parallel 2 beside DDP on CPU ranks ({dt.date.today()})",
        "",
        f"Small Llama (megalith.models): {CONFIG}; global batch {BATCH} x {SEQ} tokens; "
        f"2 Gloo ranks, 1 thread each; {args.steps} timed steps after {args.warmup} warm-up, "
        "median; forward + backward + AdamW. "
        f"Machine: {platform.machine()}, {os.cpu_count()} cores, load average "
        f"{os.getloadavg()[0]:.1f} at the end (shared machine: absolute times are noisy, "
        "the three runs alternate step by step). Last loss: rank 0's; under DDP that is "
        "its half of the batch, under TP the whole batch.",
        "",
        "| run | params per rank | step (ms, median) | tokens/s | vs DDP | last loss |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for name, ts in r0["times"].items():
        med = statistics.median(ts)
        lines.append(
            f"| {name} | {r0['params'][name]:,} | {med * 1e3:.1f} | {tokens / med:,.0f} | "
            f"{ddp / med:.2f}x | {r0['losses'][name]:.4f} |"
        )
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
