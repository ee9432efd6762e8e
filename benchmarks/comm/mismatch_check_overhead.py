"""What the always-on mismatch check costs on a ZeRO-2 step's collectives (issue 21 item 8).

The step's collectives of a model of --params parameters under ZeRO-2, as megalith_zero
issues them: one reduce_scatter per gradient bucket of --bucket-mb (12 MiB, ColossalAI's
reduce bucket and megalith's default), two one-element all_reduces (the global gradient
norm and the overflow flag), and one all_gather per bucket of updated parameters. One
bucket buffer is reused for all buckets (the volume per call is what matters). Three
modes alternate trial by trial in the same processes:

    off     the check replaced by nothing (megalith_comm before item 8)
    on      the check as shipped (exchange on new keys, Gloo ops, every 16th)
    every1  MEGALITH_COMM_CHECK_EVERY=1: an exchange before every collective (worst case)

Each trial times --steps steps (synchronised at the end of each); the median step time
per mode is reported with the overhead against `off`, and that overhead as a share of a
whole training step of --step-s seconds (default 0.529: megalith_zero stage 2 on the 1.3B
GPT, benchmarks/results/zero_gpu/2026-11-29_h200_gpt1p3b.md). Target: <= 1%.

    # H200 x2 (NCCL), the 1.3B step in bf16:
    python -m torch.distributed.run --nproc_per_node 2 benchmarks/comm/mismatch_check_overhead.py \
        --out benchmarks/results/comm_gpu/<date>_h200x2_mismatch_check.jsonl
    # CPU ranks (Gloo), a small model:
    python -m torch.distributed.run --nproc_per_node 2 benchmarks/comm/mismatch_check_overhead.py \
        --params 4e6 --bucket-mb 1 --dtype float32
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
import torch.distributed as dist

import megalith_comm as comm
from megalith_comm import mismatch

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
SHIPPED = mismatch.check


def _no_check(group, position, op, fields) -> None:
    pass


def _every1(group, position, op, fields) -> None:
    group.agreement.every = 1
    SHIPPED(group, position, op, fields)


MODES = {"off": _no_check, "on": SHIPPED, "every1": _every1}


class Step:
    """The collectives of one ZeRO-2 step on preallocated buffers."""

    def __init__(self, params: int, bucket_mb: float, dtype: torch.dtype, device: torch.device):
        n = comm.get_world().world_size
        per_bucket = int(bucket_mb * 2**20) // dtype.itemsize // n * n
        self.buckets = max(1, round(params / per_bucket))
        self.bucket = torch.randn(per_bucket, device=device).to(dtype)
        self.shard = torch.empty(per_bucket // n, dtype=dtype, device=device)
        self.norm = torch.ones(1, device=device)
        self.device = device

    def run(self) -> int:
        """One step; returns the number of collectives it issued."""
        handles = [
            comm.reduce_scatter(self.shard, self.bucket, op="avg", async_op=True)
            for _ in range(self.buckets)
        ]
        for h in handles:
            h.wait()
        comm.all_reduce(self.norm)
        comm.all_reduce(self.norm, op="max")
        for _ in range(self.buckets):
            comm.all_gather(self.bucket, self.shard)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return 2 * self.buckets + 2


def _trial(step: Step, mode: str, steps: int) -> tuple[float, float]:
    """(median step seconds, exchanges per step) for one mode."""
    mismatch.check = MODES[mode]
    group = comm.get_world().group
    every = group.agreement.every
    before = group.agreement.exchanges
    times = []
    try:
        for _ in range(steps):
            dist.barrier()  # every rank starts the step together (torch's own, unchecked)
            start = time.perf_counter()
            step.run()
            times.append(time.perf_counter() - start)
    finally:
        mismatch.check = SHIPPED
        group.agreement.every = every
    return statistics.median(times), (group.agreement.exchanges - before) / steps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--params", type=float, default=1.3e9)
    ap.add_argument("--bucket-mb", type=float, default=12.0)
    ap.add_argument("--dtype", choices=DTYPES, default="bfloat16")
    ap.add_argument("--steps", type=int, default=5, help="timed steps per trial")
    ap.add_argument("--trials", type=int, default=5, help="trials per mode, modes alternating")
    ap.add_argument("--step-s", type=float, default=0.529, help="a whole training step (s)")
    ap.add_argument("--out", help="append one json line per mode (rank 0)")
    args = ap.parse_args()
    world = comm.init()
    if world.world_size < 2:
        raise SystemExit(
            "mismatch_check_overhead.py: needs 2 ranks or more (a group of one never "
            "communicates, so there is nothing to check): run it under "
            "python -m torch.distributed.run --nproc_per_node 2"
        )
    step = Step(int(args.params), args.bucket_mb, DTYPES[args.dtype], world.device)
    calls = step.run()  # warm-up: NCCL communicators, first exchanges of every key
    rows: dict[str, list[float]] = {m: [] for m in MODES}
    exchanges: dict[str, float] = {}
    for trial in range(args.trials):
        order = list(MODES) if trial % 2 == 0 else list(reversed(MODES))
        for mode in order:
            seconds, exchanges[mode] = _trial(step, mode, args.steps)
            rows[mode].append(seconds)
    base = statistics.median(rows["off"])
    if world.rank == 0:
        for mode, values in rows.items():
            median = statistics.median(values)
            row = {
                "bench": "mismatch_check_overhead",
                "mode": mode,
                "device": str(world.device.type),
                "world": world.world_size,
                "params": int(args.params),
                "bucket_mb": args.bucket_mb,
                "dtype": args.dtype,
                "collectives_per_step": calls,
                "exchanges_per_step": exchanges[mode],
                "collectives_s": median,
                "overhead_ms": (median - base) * 1e3,
                "overhead_of_collectives": (median - base) / base,
                "overhead_of_step": (median - base) / args.step_s,
                "trials_s": values,
            }
            print(
                f"{mode:7s} {median * 1e3:9.2f} ms/step of collectives ({calls} calls, "
                f"{exchanges[mode]:.1f} exchanges): overhead {row['overhead_ms']:+.2f} ms = "
                f"{100 * row['overhead_of_collectives']:+.2f}% of the collectives, "
                f"{100 * row['overhead_of_step']:+.3f}% of a {args.step_s} s step",
                flush=True,
            )
            if args.out:
                with open(args.out, "a") as f:
                    f.write(json.dumps(row) + "\n")
    comm.destroy()


if __name__ == "__main__":
    main()
