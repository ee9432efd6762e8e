"""Pipeline step time per schedule on CPU ranks, beside torch.distributed.pipelining.

    python benchmarks/pipeline/cpu_schedules.py [--pp 2 4] [--microbatches 8] [--steps 15]
        [--out benchmarks/results/pipeline/<date>_cpu.md]

For each pp it spawns pp CPU ranks (Gloo, one thread each) and, in one process
group, runs every schedule of megalith_pipeline on a small GPT (megalith.models' gpt-tiny
with 8 blocks, cut by its pipeline_parts(): embedding, blocks, head) and the matching schedule of
torch.distributed.pipelining on the same stages. A step is the forward and backward
of every micro-batch (no optimizer), timed from a barrier to the slowest rank's end;
the median over the timed steps is reported. Beside it: the bubble measured from the
ranks' compute spans (1 - busy / (pp x makespan)), the simulator's bubble for the
measured pass times, and the 1F1B theory (p - 1) / (m + p - 1). A single process
running the whole model over the same micro-batches (gradient accumulation) is the
no-pipeline reference. All of them run in rounds, one step each per round.

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
import time
from pathlib import Path

import torch

from megalith.models import GPTConfig, create, get_config, num_parameters

#: megalith.models' gpt-tiny (d128, 4 heads) with 8 blocks, seq 64, a 2048-token vocabulary
#: and an untied head: 2.12 M params, the model of the earlier results
CONFIG = get_config(
    "gpt-tiny", n_layers=8, max_seq_len=64, vocab_size=2048, tie_word_embeddings=False
)

SCHEDULES = ("gpipe", "1f1b", "interleaved", "zb-h1", "zb-v")
BATCH = 16


def loss_fn(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.cross_entropy(
        logits.reshape(-1, logits.shape[-1]), targets.reshape(-1)
    )


def _model(c: GPTConfig) -> torch.nn.Module:
    """The same values on every rank (megalith.models seeds each parameter by its name)."""
    return create(c, device="cpu", seed=0)


def _data(c: GPTConfig) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    shape = (BATCH, c.max_seq_len)
    return torch.randint(0, c.vocab_size, shape, generator=g), torch.randint(
        0, c.vocab_size, shape, generator=g
    )


def _torch_peer(name: str, pipe, x, y, m: int):
    """The same stages under torch.distributed.pipelining's matching schedule."""
    from torch.distributed.pipelining import (
        PipelineStage,
        Schedule1F1B,
        ScheduleGPipe,
        ScheduleInterleaved1F1B,
        ScheduleInterleavedZeroBubble,
        ScheduleZBVZeroBubble,
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
    elif name == "zb-v":  # two stages per rank in the V placement, in both libraries
        sched = ScheduleZBVZeroBubble(stages, m, loss_fn=loss_fn)
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


def _whole_model(c: GPTConfig, x: torch.Tensor, y: torch.Tensor, m: int):
    """The no-pipeline reference: the whole model on one rank, m micro-batches accumulated."""
    model = _model(c)

    def run():
        for xs, ys in zip(x.chunk(m), y.chunk(m)):
            (loss_fn(model(xs), ys) / m).backward()
        model.zero_grad(set_to_none=True)

    return run


def worker(rank: int, cfg: dict) -> dict:
    """Builds every runner, then times them in rounds: each round runs each runner once,
    so a change in the machine's load hits all of them alike."""
    import megalith_comm as comm
    from megalith_pipeline import Pipeline

    torch.set_num_threads(1)
    c = CONFIG
    x, y = _data(c)
    m, world = cfg["m"], comm.get_world().world_size
    # (schedule, library, run, pipe); on ranks > 0 the whole-model run is a wait at the barrier
    whole = _whole_model(c, x, y, m) if rank == 0 else (lambda: None)
    runners: list[tuple[str, str, object, object]] = [("-", "whole", whole, None)]
    errors = {}
    for name in SCHEDULES:
        # A group per pipeline: its channels' shape caches and tags are its own.
        group = comm.new_group(range(world), name=f"bench_{name}", exclusive=True)
        pipe = Pipeline(_model(c), num_microbatches=m, schedule=name, loss_fn=loss_fn, group=group)

        def run(pipe=pipe):
            pipe.step(x, y)
            for p in pipe.module.parameters():
                p.grad = None

        runners.append((name, "megalith", run, pipe))
        try:
            runners.append((name, "torch", _torch_peer(name, pipe, x, y, m), None))
        except Exception as exc:  # report, do not hide, what the peer cannot run
            errors[name] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:120]}"
    times: dict[str, list[float]] = {}
    stats: dict[str, list] = {}
    for i in range(cfg["warmup"] + cfg["steps"]):
        for name, lib, run, pipe in runners:
            comm.barrier()
            t0 = time.perf_counter()
            run()
            comm.barrier()  # the slowest rank's end
            if i >= cfg["warmup"]:
                times.setdefault(f"{name}/{lib}", []).append(time.perf_counter() - t0)
                if pipe is not None:
                    stats.setdefault(name, []).append(pipe.last_stats)
    return {"times": times, "stats": stats, "errors": errors}


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
    c = CONFIG
    m = args.microbatches
    tokens = BATCH * c.max_seq_len
    params = num_parameters(c)
    med = statistics.median
    rows, loads = [], []
    for pp in args.pp:
        loads.append(wait_for_quiet(args.max_load, args.max_wait))
        cfg = {"m": m, "steps": args.steps, "warmup": args.warmup}
        per_rank = run_distributed(worker, pp, cfg, timeout=3000)
        times, errors = per_rank[0]["times"], per_rank[0]["errors"]
        whole = med(times["-/whole"])
        rows.append(
            f"| {pp} | no pipeline (rank 0 alone) | {whole * 1e3:.0f} | {tokens / whole:,.0f} "
            "| - | - | - | - | - |"
        )
        for name in SCHEDULES:
            step = med(times[f"{name}/megalith"])
            sched = make_schedule(name, pp, m)
            by_step = list(zip(*[r["stats"][name] for r in per_rank]))  # each: every rank's
            measured = med(measured_bubble(st) for st in by_step)
            simulated = med(
                simulate(sched, mean_pass_times(st, sched.num_stages)).bubble_fraction
                for st in by_step
            )
            peer = times.get(f"{name}/torch")
            peer_cols = (
                f"{med(peer) * 1e3:.0f} | {med(peer) / step:.2f}x"
                if peer
                else f"({errors.get(name, 'n/a')}) | -"
            )
            rows.append(
                f"| {pp} | {name} | {step * 1e3:.0f} | {tokens / step:,.0f} | {measured:.3f} | "
                f"{simulated:.3f} | {theory_bubble_1f1b(pp, m):.3f} | {peer_cols} |"
            )
            print(rows[-1], flush=True)
    lines = [
        f"# Pipeline schedules on CPU ranks: small GPT ({params / 1e6:.2f} M params, "
        f"{c.n_layers} blocks, dim {c.d_model}, seq {c.max_seq_len}), batch {BATCH} in {m} "
        "micro-batches",
        "",
        f"{dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M} UTC; torch {torch.__version__}, "
        f"{os.cpu_count()} CPUs ({platform.processor() or platform.machine()}), one thread per "
        "rank, Gloo; 1-minute load average when each pp started: "
        f"{', '.join(f'{x:.1f}' for x in loads)} (the machine is shared). Step = forward + "
        f"backward of every micro-batch, median of {args.steps} steps after {args.warmup} "
        "warm-up, from a barrier to the slowest rank's end. Every runner of one pp (no "
        "pipeline, each schedule, each torch peer) runs once per round, so a change in load "
        "hits all of them alike.",
        "",
        "| pp | schedule | step (ms) | tokens/s | bubble measured | bubble simulated | "
        "theory (p-1)/(m+p-1) | torch.distributed.pipelining (ms) | torch / megalith |",
        "|---|---|---|---|---|---|---|---|---|",
        *rows,
        "",
        "bubble measured: 1 - (compute time summed over ranks) / (pp x makespan), median over "
        "the timed steps; simulated: the simulator given each step's mean time per pass kind "
        "and stage and its measured message latency, median. torch / megalith above 1: "
        "megalith is faster. interleaved runs 2 chunks per rank in both libraries; torch's "
        "zb-h1 peer is ScheduleInterleavedZeroBubble on the same one stage per rank; zb-v runs "
        "two stages per rank in the V placement, beside torch's ScheduleZBVZeroBubble. "
        "No pipeline: the whole model on rank 0 while the other ranks wait (the same "
        "micro-batches, gradients accumulated).",
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        Path(args.out).write_text(text)


if __name__ == "__main__":
    main()
