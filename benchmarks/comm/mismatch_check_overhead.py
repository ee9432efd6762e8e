"""What the always-on mismatch check costs, per collective and per ZeRO-2 step (issue 21 item 8).

The check (megalith_comm.mismatch) folds every collective's key into a digest on the
host (`note`) and, before some collectives, all-gathers four int64 over the group's Gloo
group (an exchange). Over Gloo (CPU tensors) every collective exchanges, so CPU ranks see
the check at its most expensive; on CUDA only new keys and every 16th collective do.
Modes alternate trial by trial in the same processes:

    off     mismatch.check replaced by nothing (megalith_comm before item 8)
    on      the check as shipped
    every1  MEGALITH_COMM_CHECK_EVERY=1: an exchange before every collective (worst case;
            only with --every1)

Parts (--skip a,b to leave some out):

    note        the host-side fold alone, one process (what a non-exchanging collective pays)
    collective  --iters back-to-back calls of all_reduce / reduce_scatter / all_gather at
                a few sizes: microseconds per call, and exchanges per call
    zero2       the collectives of one ZeRO-2 step of a --params model as megalith_zero
                issues them (one reduce_scatter and one all_gather per --bucket-mb bucket,
                two one-element all_reduces), on preallocated buffers; the overhead also
                as a share of a whole step of --step-s seconds (default 0.529: stage 2 on
                the 1.3B GPT, benchmarks/results/zero_gpu/2026-11-29_h200_gpt1p3b.md).
                Target: <= 1%.
    step        a real ZeRO-2 training step (LowLevelZeroPlugin stage 2, fp32) of a
                megalith.models GPT (--model): seconds per step, collectives and exchanges
                it issued, the overhead as a share of the step, and the time spent inside
                the check (an upper bound: an exchange also absorbs the ranks' skew, which
                the next collective would have waited for). CPU ranks only.

    # CPU ranks (Gloo): every part
    python -m torch.distributed.run --nproc_per_node 2 benchmarks/comm/mismatch_check_overhead.py \
        --params 4e6 --bucket-mb 1 --dtype float32 \
        --out benchmarks/results/comm_cpu/<date>_cpu2_mismatch_overhead.jsonl
    # H200 x2 (NCCL), the 1.3B step's collectives in bf16:
    python -m torch.distributed.run --nproc_per_node 2 benchmarks/comm/mismatch_check_overhead.py \
        --skip note,collective,step --every1 \
        --out benchmarks/results/comm_gpu/<date>_h200x2_mismatch_check.jsonl
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable

import torch
import torch.distributed as dist

import megalith_comm as comm
from megalith_comm import mismatch

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
SHIPPED = mismatch.check
COUNTS = {"checked": 0, "exchanges": 0, "inside_s": 0.0}


def _no_check(group, position, op, fields) -> None:
    COUNTS["checked"] += 1


def _counted(group, position, op, fields, check: Callable = SHIPPED) -> None:
    before, start = group.agreement.exchanges, time.perf_counter()
    check(group, position, op, fields)
    # an upper bound of the check's cost: its exchange also absorbs the ranks' skew,
    # which the collective after it would otherwise have waited for
    COUNTS["inside_s"] += time.perf_counter() - start
    COUNTS["checked"] += 1
    COUNTS["exchanges"] += group.agreement.exchanges - before


def _every1_check(group, position, op, fields) -> None:
    group.agreement.every = 1
    SHIPPED(group, position, op, fields)


def _every1(group, position, op, fields) -> None:
    _counted(group, position, op, fields, _every1_check)


MODES = {"off": _no_check, "on": _counted, "every1": _every1}
ACTIVE = ["off", "on"]  # --every1 appends "every1"


def _timed(mode: str, body: Callable[[], None]) -> tuple[float, float, float, float]:
    """(seconds, collectives, exchanges, seconds inside the check) of body() in `mode`."""
    mismatch.check = MODES[mode]
    COUNTS.update(checked=0, exchanges=0, inside_s=0.0)
    group = comm.get_world().group
    every = group.agreement.every
    try:
        dist.barrier()  # every rank starts together (torch's own call: not checked)
        start = time.perf_counter()
        body()
        if comm.get_world().device.type == "cuda":
            torch.cuda.synchronize()
        seconds = time.perf_counter() - start
    finally:
        mismatch.check = SHIPPED
        group.agreement.every = every
    return seconds, COUNTS["checked"], COUNTS["exchanges"], COUNTS["inside_s"]


def _alternating(body: Callable[[], None], trials: int) -> dict[str, dict]:
    """Median seconds per mode over `trials` trials, the modes' order flipped each trial."""
    out: dict[str, dict] = {m: {"trials_s": [], "inside_s": []} for m in ACTIVE}
    for trial in range(trials):
        for mode in ACTIVE if trial % 2 == 0 else list(reversed(ACTIVE)):
            seconds, checked, exchanges, inside = _timed(mode, body)
            out[mode]["trials_s"].append(seconds)
            out[mode]["inside_s"].append(inside)
            out[mode].update(collectives=checked, exchanges=exchanges)
    for row in out.values():  # on a shared machine noise only adds: min is the steadier
        row["median_s"] = statistics.median(row["trials_s"])
        row["min_s"] = min(row["trials_s"])
        row["inside_median_s"] = statistics.median(row["inside_s"])
    return out


def note_cost(calls: int = 200_000) -> float:
    """Seconds per Agreement.note of a typical bucket key (a repeated key: the common case)."""
    agreement = mismatch.Agreement("bench", every=16)
    fields = {"dtype": torch.float32, "device": "cuda", "redop": "avg", "shape": (3_145_728,)}
    agreement.note(0, "reduce_scatter", fields)
    start = time.perf_counter()
    for i in range(1, calls + 1):
        agreement.note(i, "reduce_scatter", fields)
    return (time.perf_counter() - start) / calls


def collective_rows(iters: int, trials: int) -> list[dict]:
    world = comm.get_world()
    n, dev = world.world_size, world.device
    rows = []
    for numel in (1, 1 << 18, 1 << 20):  # 4 B, 1 MiB, 4 MiB of fp32
        full = torch.randn(numel * n, device=dev)
        shard = torch.empty(numel, device=dev)
        small = torch.randn(numel, device=dev)
        calls = {
            "all_reduce": lambda small=small: comm.all_reduce(small),
            "reduce_scatter": lambda s=shard, f=full: comm.reduce_scatter(s, f, op="avg"),
            "all_gather": lambda f=full, s=shard: comm.all_gather(f, s),
        }
        n_calls = iters if numel == 1 else max(10, iters // 10)  # a trial of ~0.1-1 s
        for op, call in calls.items():
            call()  # the first call of a key exchanges in every mode: not timed

            def body(call=call, n_calls=n_calls) -> None:
                for _ in range(n_calls):
                    call()

            modes = _alternating(body, trials)
            row = {"part": "collective", "op": op, "bytes": numel * 4}
            for stat in ("median", "min"):
                off = modes["off"][f"{stat}_s"] / n_calls
                on = modes["on"][f"{stat}_s"] / n_calls
                row.update(
                    {
                        f"off_us_{stat}": off * 1e6,
                        f"on_us_{stat}": on * 1e6,
                        f"overhead_us_{stat}": (on - off) * 1e6,
                        f"overhead_{stat}": (on - off) / off,
                    }
                )
            row["exchanges_per_call"] = modes["on"]["exchanges"] / n_calls
            rows.append(row)
    return rows


class Zero2Collectives:
    """The collectives of one ZeRO-2 step on preallocated buffers (one reused bucket: the
    volume per call is what matters)."""

    def __init__(self, params: int, bucket_mb: float, dtype: torch.dtype, device: torch.device):
        n = comm.get_world().world_size
        per_bucket = int(bucket_mb * 2**20) // dtype.itemsize // n * n
        self.buckets = max(1, round(params / per_bucket))
        self.bucket = torch.randn(per_bucket, device=device).to(dtype)
        self.shard = torch.empty(per_bucket // n, dtype=dtype, device=device)
        self.norm = torch.ones(1, device=device)

    def run(self) -> None:
        handles = [
            comm.reduce_scatter(self.shard, self.bucket, op="avg", async_op=True)
            for _ in range(self.buckets)
        ]
        for h in handles:
            h.wait()
        comm.all_reduce(self.norm)  # the global gradient norm
        comm.all_reduce(self.norm, op="max")  # the overflow flag
        for _ in range(self.buckets):
            comm.all_gather(self.bucket, self.shard)


def zero2_row(args: argparse.Namespace) -> dict:
    world = comm.get_world()
    step = Zero2Collectives(int(args.params), args.bucket_mb, DTYPES[args.dtype], world.device)

    def body() -> None:
        for _ in range(args.steps):
            step.run()

    body()  # warm-up: NCCL communicators, every key's first exchange
    modes = _alternating(body, args.trials)
    base = modes["off"]["median_s"] / args.steps
    row = {
        "part": "zero2",
        "params": int(args.params),
        "bucket_mb": args.bucket_mb,
        "dtype": args.dtype,
        "collectives_per_step": modes["off"]["collectives"] / args.steps,
    }
    for mode, stats in modes.items():
        median = stats["median_s"] / args.steps
        row[mode] = {
            "collectives_s": median,
            "exchanges_per_step": stats.get("exchanges", 0) / args.steps,
            "overhead_ms": (median - base) * 1e3,
            "overhead_of_collectives": (median - base) / base,
            "overhead_of_step": (median - base) / args.step_s,
        }
    return row


def step_row(args: argparse.Namespace) -> dict:
    import megalith.models
    from megalith.booster import Booster, LowLevelZeroPlugin

    rank = comm.get_world().rank
    model = megalith.models.create(
        args.model, device="cpu", seed=0, vocab_size=args.vocab, max_seq_len=args.seq_len
    )
    params = sum(p.numel() for p in model.parameters())
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
    booster = Booster(plugin=LowLevelZeroPlugin(stage=2, precision="fp32"))
    model, optimizer, *_ = booster.boost(model, optimizer)
    gen = torch.Generator().manual_seed(1 + rank)
    batch = torch.randint(0, args.vocab, (args.batch, args.seq_len), generator=gen)

    def step() -> None:
        loss = model(batch, labels=batch).loss
        booster.backward(loss, optimizer)
        optimizer.step()
        optimizer.zero_grad()

    step()  # warm-up: every key's first exchange, the optimizer's states
    modes = _alternating(step, args.step_trials)
    row = {
        "part": "step",
        "model": args.model,
        "params": params,
        "batch": args.batch,
        "seq_len": args.seq_len,
    }
    for stat in ("median", "min"):
        off, on = modes["off"][f"{stat}_s"], modes["on"][f"{stat}_s"]
        row.update(
            {
                f"off_s_{stat}": off,
                f"on_s_{stat}": on,
                f"overhead_ms_{stat}": (on - off) * 1e3,
                f"overhead_{stat}": (on - off) / off,
            }
        )
    row.update(
        inside_check_ms_median=modes["on"]["inside_median_s"] * 1e3,
        inside_check_of_step=modes["on"]["inside_median_s"] / modes["off"]["median_s"],
        collectives_per_step=modes["on"]["collectives"],
        exchanges_per_step=modes["on"]["exchanges"],
        trials_off_s=modes["off"]["trials_s"],
        trials_on_s=modes["on"]["trials_s"],
    )
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iters", type=int, default=200, help="calls per trial (4 B; /10 larger)")
    ap.add_argument("--trials", type=int, default=7, help="trials per mode (collectives)")
    ap.add_argument("--model", default="gpt-small", help="a megalith.models preset")
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--step-trials", type=int, default=8, help="steps per mode, alternating")
    ap.add_argument("--params", type=float, default=1.3e9, help="zero2: model parameters")
    ap.add_argument("--bucket-mb", type=float, default=12.0, help="zero2: bucket size")
    ap.add_argument("--dtype", choices=DTYPES, default="bfloat16", help="zero2: gradient dtype")
    ap.add_argument("--steps", type=int, default=5, help="zero2: steps per trial")
    ap.add_argument("--step-s", type=float, default=0.529, help="zero2: a whole step (s)")
    ap.add_argument("--every1", action="store_true", help="also time the every-call check")
    ap.add_argument("--skip", default="", help="comma-separated parts to skip")
    ap.add_argument("--out", help="append one json line per row (rank 0)")
    args = ap.parse_args()
    world = comm.init()
    if world.world_size < 2:
        raise SystemExit(
            "mismatch_check_overhead.py: needs 2 ranks or more (a group of one never checks): "
            "python -m torch.distributed.run --nproc_per_node 2 ..."
        )
    skip = set(filter(None, args.skip.split(",")))
    if args.every1:
        ACTIVE.append("every1")
    if world.device.type == "cuda":
        skip.add("step")  # the real step part builds a CPU model
    rows = []
    if "note" not in skip:
        rows.append({"part": "note", "us_per_call": note_cost() * 1e6})
    if "collective" not in skip:
        rows += collective_rows(args.iters, args.trials)
    if "zero2" not in skip:
        rows.append(zero2_row(args))
    if "step" not in skip:
        rows.append(step_row(args))
    if world.rank == 0:
        for row in rows:
            row.update(bench="mismatch_check_overhead", world=world.world_size)
            row["device"] = world.device.type
            print(json.dumps(row), flush=True)
            if args.out:
                with open(args.out, "a") as f:
                    f.write(json.dumps(row) + "\n")
    comm.destroy()


if __name__ == "__main__":
    main()
