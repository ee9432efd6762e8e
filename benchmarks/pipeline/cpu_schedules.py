"""Pipeline step time per schedule on CPU ranks, beside torch.distributed.pipelining.

    python benchmarks/pipeline/cpu_schedules.py [--pp 2 4] [--microbatches 8] [--steps 15]
        [--out benchmarks/results/pipeline_cpu_<date>.md]

For each pp it spawns pp CPU ranks (Gloo, one thread each) and, in one process
group, runs every schedule of megalith_pipeline on a small GPT (small_gpt.py:
embedding, blocks, head; cut by layer count), then the matching schedule of
torch.distributed.pipelining on the same stages. A step is the forward and backward
of every micro-batch (no optimizer), timed from a barrier to the slowest rank's end;
the median over the timed steps is reported. Beside it: the bubble measured from the
ranks' compute spans (1 - busy / (pp x makespan)), the simulator's bubble for the
measured pass times, and the 1F1B theory (p - 1) / (m + p - 1). A single process
running the whole model over the same micro-batches (gradient accumulation) is the
no-pipeline reference.

The machine's cores bound what pp can gain: with more ranks than cores, ranks share
cores and an idle rank gives its core to another, so step times then measure
contention more than schedules.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from small_gpt import Config, SmallGPT, loss_fn  # noqa: E402

SCHEDULES = ("gpipe", "1f1b", "interleaved", "zb-h1")
BATCH = 16


def _data(c: Config) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return torch.randint(0, c.vocab, (BATCH, c.seq), generator=g), torch.randint(
        0, c.vocab, (BATCH, c.seq), generator=g
    )


def _time_pair(runs, warmup: int, steps: int) -> list[list[float]]:
    """Each runner's step times, the runners alternating step by step (a drift in the
    machine's load hits both alike)."""
    import megalith_comm as comm

    times: list[list[float]] = [[] for _ in runs]
    for i in range(warmup + steps):
        for k, run in enumerate(runs):
            comm.barrier()
            t0 = time.perf_counter()
            run()
            comm.barrier()  # the slowest rank's end
            if i >= warmup:
                times[k].append(time.perf_counter() - t0)
    return times


def _torch_peer(name: str, pipe, x, y, m: int):
    """The same stages under torch.distributed.pipelining's matching schedule."""
    from torch.distributed.pipelining import (
        PipelineStage,
        Schedule1F1B,
        ScheduleGPipe,
        ScheduleInterleaved1F1B,
        ScheduleInterleavedZeroBubble,
    )

    s = pipe.schedule
    stages = [
        PipelineStage(pipe.stages[i], i, s.num_stages, torch.device("cpu"))
        for i in sorted(pipe.stages)
    ]
    if name == "gpipe":
        sched = ScheduleGPipe(stages[0], m, loss_fn=loss_fn)
    elif name == "1f1b":
        sched = Schedule1F1B(stages[0], m, loss_fn=loss_fn)
    elif name == "interleaved":
        sched = ScheduleInterleaved1F1B(stages, m, loss_fn=loss_fn)
    else:
        sched = ScheduleInterleavedZeroBubble(stages, m, loss_fn=loss_fn)

    def run():
        kwargs = {}
        if pipe.is_last:
            kwargs = {"target": y, "losses": []}
        args = (x,) if pipe.is_first else ()
        sched.step(*args, **kwargs)
        for p in pipe.module.parameters():
            p.grad = None

    return run


def worker(rank: int, cfg: dict) -> list[dict]:
    from megalith_pipeline import Pipeline

    torch.set_num_threads(1)
    c = Config()
    x, y = _data(c)
    m = cfg["m"]
    rows = []
    for name in SCHEDULES:
        torch.manual_seed(0)
        pipe = Pipeline(SmallGPT(c), num_microbatches=m, schedule=name, loss_fn=loss_fn)

        def run(pipe=pipe):
            pipe.step(x, y)
            for p in pipe.module.parameters():
                p.grad = None

        row: dict = {"schedule": name, "peer": None}
        try:
            runs = [run, _torch_peer(name, pipe, x, y, m)]
        except Exception as exc:  # report, do not hide, what the peer cannot run
            row["peer_error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:120]}"
            runs = [run]
        times = _time_pair(runs, cfg["warmup"], cfg["steps"])
        row["times"] = times[0]
        row["peer"] = times[1] if len(times) > 1 else None
        import megalith_comm as comm

        comm.barrier()
        pipe.step(x, y)  # once more alone: the stats of a step without the peer around it
        row["stats"] = pipe.last_stats
        rows.append(row)
    return rows


def single_process(c: Config, m: int, warmup: int, steps: int) -> float:
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = SmallGPT(c)
    x, y = _data(c)
    times = []
    for i in range(warmup + steps):
        t0 = time.perf_counter()
        for xs, ys in zip(x.chunk(m), y.chunk(m)):
            (loss_fn(model(xs), ys) / m).backward()
        model.zero_grad(set_to_none=True)
        if i >= warmup:
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def wait_for_quiet(max_load: float, max_wait: float) -> float:
    """Waits (at most max_wait s) until the 1-minute load average is below max_load;
    returns the load seen when starting."""
    end = time.monotonic() + max_wait
    while os.getloadavg()[0] > max_load and time.monotonic() < end:
        time.sleep(5)
    return os.getloadavg()[0]


def main() -> None:
    from megalith.testing import run_distributed
    from megalith_pipeline import make_schedule, mean_pass_times, measured_bubble, simulate
    from megalith_pipeline.simulator import theory_bubble_1f1b

    ap = argparse.ArgumentParser()
    ap.add_argument("--pp", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--microbatches", type=int, default=8)
    ap.add_argument("--steps", type=int, default=15)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--out", default=None)
    ap.add_argument("--max-load", type=float, default=1.0, help="wait for a load below this")
    ap.add_argument("--max-wait", type=float, default=600.0, help="but at most this long (s)")
    args = ap.parse_args()
    c = Config()
    m = args.microbatches
    tokens = BATCH * c.seq
    params = sum(p.numel() for p in SmallGPT(c).parameters())
    loads = [wait_for_quiet(args.max_load, args.max_wait)]
    base = single_process(c, m, args.warmup, args.steps)
    lines = [
        f"# Pipeline schedules on CPU ranks: small GPT ({params / 1e6:.2f} M params, "
        f"{c.layers} blocks, dim {c.dim}, seq {c.seq}), batch {BATCH} in {m} micro-batches",
        "",
        f"{dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M} UTC; torch {torch.__version__}, "
        f"{os.cpu_count()} CPUs ({platform.processor() or platform.machine()}), one thread per "
        f"rank, Gloo; 1-minute load average when each part started: {{loads}}. "
        f"Step = forward + backward of every micro-batch, median of {args.steps} steps "
        f"after {args.warmup} warm-up, slowest rank; megalith's and torch's steps alternate.",
        "",
        f"No pipeline (one process, the whole model, {m} micro-batches accumulated): "
        f"{base * 1e3:.0f} ms/step, {tokens / base:,.0f} tokens/s.",
        "",
        "| pp | schedule | step (ms) | tokens/s | bubble measured | bubble simulated | "
        "theory (p-1)/(m+p-1) | torch.distributed.pipelining (ms) | torch / megalith |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for pp in args.pp:
        cfg = {"m": m, "steps": args.steps, "warmup": args.warmup}
        loads.append(wait_for_quiet(args.max_load, args.max_wait))
        per_rank = run_distributed(worker, pp, cfg, timeout=3000)
        for i, name in enumerate(SCHEDULES):
            rows = [r[i] for r in per_rank]
            step = statistics.median(rows[0]["times"])
            stats = [r["stats"] for r in rows]
            sched = make_schedule(name, pp, m)
            sim = simulate(sched, mean_pass_times(stats, sched.num_stages)).bubble_fraction
            if rows[0]["peer"]:
                peer = statistics.median(rows[0]["peer"])
                peer_cols = f"{peer * 1e3:.0f} | {peer / step:.2f}x"
            else:
                peer_cols = f"({rows[0].get('peer_error', 'n/a')}) | -"
            lines.append(
                f"| {pp} | {name} | {step * 1e3:.0f} | {tokens / step:,.0f} | "
                f"{measured_bubble(stats):.3f} | {sim:.3f} | {theory_bubble_1f1b(pp, m):.3f} | "
                f"{peer_cols} |"
            )
            print(lines[-1], flush=True)
    lines += [
        "",
        "bubble measured: 1 - (compute time summed over ranks) / (pp x makespan) for the last "
        "timed step; simulated: the simulator given that step's mean time per pass kind and "
        "stage and the measured message latency. torch / megalith above 1: megalith is faster. "
        "interleaved runs 2 chunks per rank (both libraries); torch's zero-bubble peer is "
        "ScheduleInterleavedZeroBubble on the same one stage per rank.",
    ]
    text = "\n".join(lines).replace("{loads}", ", ".join(f"{x:.1f}" for x in loads)) + "\n"
    print(text)
    if args.out:
        Path(args.out).write_text(text)


if __name__ == "__main__":
    main()
