"""ZeRO on CPU ranks beside torch DDP and FSDP2 (fully_shard), same small GPT, same run.

The model: megalith.models' gpt-tiny widened to d256 (4 blocks, 4 heads, seq 128, an
8192-token vocabulary, tied head; 5.29 M params, the model of the earlier results).

    python benchmarks/zero/cpu_world2.py [--world 2] [--steps 10] [--out benchmarks/results/zero_cpu/<date>_cpu_world2.md]

Each mode runs in fresh rank processes (one thread each): warm-up steps, then the
median step time (forward + backward + optimizer step, AdamW, fp32). Memory per
rank: the bytes of model state the rank holds after a step (parameters, gradients,
optimizer states, counted from its tensors; for megalith from the engine's
accounting); for megalith also the peak of what is held only during a step
(full-size gradient chunks being reduced, stage 3's gathered chunks), which the
peers' tensor count cannot see for themselves; and the growth of the process's
peak RSS over the run (which also counts activations and allocator slack).
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import time
from pathlib import Path

import torch

from megalith.models import create, get_config

CONFIG = get_config("gpt-tiny", d_model=256, d_ff=1024, max_seq_len=128, vocab_size=8192)

MODES = ["ddp", "fsdp2", "zero1", "zero2", "zero3"]


def _rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _tensor_bytes(ts) -> int:
    seen, total = set(), 0
    for t in ts:
        if t is None:
            continue
        if hasattr(t, "to_local"):
            t = t.to_local()
        key = (t.untyped_storage().data_ptr(), t.untyped_storage().nbytes())
        if key not in seen:
            seen.add(key)
            total += t.untyped_storage().nbytes()
    return total


def bench(rank: int, mode: str, steps: int, warmup: int, batch: int):
    import megalith_comm as comm

    torch.set_num_threads(1)
    world = comm.get_world()
    cfg = CONFIG
    rss0 = _rss_mib()
    model = create(cfg, device="cpu", seed=0)  # the same values on every rank
    g = torch.Generator().manual_seed(rank)
    data = [
        torch.randint(0, cfg.vocab_size, (batch, cfg.max_seq_len + 1), generator=g)
        for _ in range(steps + warmup)
    ]

    if mode == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        net = DistributedDataParallel(model)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        backward, step, zero_grad = (
            (lambda loss: loss.backward()),
            opt.step,
            (lambda: opt.zero_grad()),
        )
    elif mode == "fsdp2":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh("cpu", (world.world_size,))
        for b in model.pipeline_parts()[1]:  # the blocks
            fully_shard(b, mesh=mesh)
        fully_shard(model, mesh=mesh)
        net = model
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        backward, step, zero_grad = (
            (lambda loss: loss.backward()),
            opt.step,
            (lambda: opt.zero_grad()),
        )
    else:
        import megalith_zero as zero

        opt0 = torch.optim.AdamW(model.parameters(), lr=1e-4)
        net, opt = zero.shard(model, opt0, zero.ZeroConfig(stage=int(mode[-1])))
        backward, step, zero_grad = opt.backward, opt.step, opt.zero_grad

    times = []
    for i, tokens in enumerate(data):
        comm.barrier()
        t0 = time.perf_counter()
        logits = net(tokens[:, :-1])
        loss = torch.nn.functional.cross_entropy(
            logits.reshape(-1, cfg.vocab_size), tokens[:, 1:].reshape(-1)
        )
        backward(loss)
        step()
        zero_grad() if mode.startswith("zero") else None
        t1 = time.perf_counter()
        if mode in ("ddp", "fsdp2"):
            state = _tensor_bytes(
                list(model.parameters())
                + [p.grad for p in model.parameters()]
                + [v for s in opt.state.values() for v in s.values() if torch.is_tensor(v)]
            )
            opt.zero_grad()
        if i >= warmup:
            times.append(t1 - t0)
    in_flight = 0
    if mode.startswith("zero"):
        rep = net.memory_report()
        state = sum(rep[k].current_bytes for k in ("params", "master", "optim_states", "grads"))
        in_flight = rep["grads_in_flight"].peak_bytes + rep["gathered"].peak_bytes
    n_params = sum(p.numel() for p in model.parameters())
    comm.barrier()
    return {
        "mode": mode,
        "median_s": statistics.median(times),
        "state_mib": state / 2**20,
        "in_flight_mib": in_flight / 2**20,
        "rss_growth_mib": _rss_mib() - rss0,
        "params": n_params,
        "loss": float(loss),
    }


def main() -> None:
    from megalith.testing import run_distributed

    ap = argparse.ArgumentParser()
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    rows = []
    for mode in a.modes.split(","):
        per_rank = run_distributed(bench, a.world, mode, a.steps, a.warmup, a.batch, timeout=1800)
        r0 = per_rank[0]
        r0["median_s"] = max(r["median_s"] for r in per_rank)
        rows.append(r0)
        print(r0, flush=True)
    ddp = next((r for r in rows if r["mode"] == "ddp"), None)
    fsdp = next((r for r in rows if r["mode"] == "fsdp2"), None)
    lines = [
        f"# ZeRO on CPU ranks: world {a.world}, small GPT ({rows[0]['params'] / 1e6:.2f} M params, fp32, AdamW), "
        f"batch {a.batch} x {CONFIG.max_seq_len} per rank, {a.steps} timed steps",
        "",
        f"torch {torch.__version__}, {os.cpu_count()} CPUs, one thread per rank. Same run, fresh ranks per mode.",
        "",
        "| mode | step (s, median, slowest rank) | vs DDP | vs FSDP2 | model state / rank (MiB) | + in flight, peak (MiB) | peak RSS growth (MiB) |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        vs_ddp = f"{ddp['median_s'] / r['median_s']:.2f}x" if ddp else "-"
        vs_fsdp = f"{fsdp['median_s'] / r['median_s']:.2f}x" if fsdp else "-"
        lines.append(
            f"| {r['mode']} | {r['median_s']:.3f} | {vs_ddp} | {vs_fsdp} | {r['state_mib']:.1f} | {r['in_flight_mib']:.1f} | {r['rss_growth_mib']:.0f} |"
        )
    lines += [
        "",
        "vs DDP / vs FSDP2: the peer's step time divided by this mode's (above 1: faster than the peer).",
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    if a.out:
        Path(a.out).write_text(text)


if __name__ == "__main__":
    main()
