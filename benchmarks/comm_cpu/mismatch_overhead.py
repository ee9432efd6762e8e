"""What the always-on mismatch check costs on CPU ranks, per collective and per ZeRO-2 step.

Issue 21 item 8. The check (megalith_comm.mismatch) folds every collective's key into a
digest on the host (`note`) and, before some collectives, all-gathers four int64 over
the group's Gloo group (an exchange). Over Gloo (CPU tensors) every collective exchanges,
so CPU ranks see the check at its most expensive; on CUDA only new keys and every 16th
collective do (benchmarks/comm/mismatch_check_overhead.py measures that on the GPUs).

Three parts, each with the check off (mismatch.check replaced by nothing) and on (as
shipped), alternating trial by trial in the same processes:

    note        the host-side fold alone, one process (what a non-exchanging collective pays)
    collective  --iters back-to-back calls of all_reduce / reduce_scatter / all_gather at
                a few sizes: microseconds per call, and exchanges per call
    step        a ZeRO-2 training step (LowLevelZeroPlugin stage 2, fp32) of a megalith.models
                GPT sized for a step of a few seconds: seconds per step, the collectives
                and exchanges it issued, the overhead as a share of the step, and the
                time spent inside the check (an upper bound: an exchange also absorbs
                the ranks' skew, which the next collective would have waited for)

    python -m torch.distributed.run --nproc_per_node 2 benchmarks/comm_cpu/mismatch_overhead.py \
        --out benchmarks/results/comm_cpu/<date>_cpu2_mismatch_overhead.jsonl
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

SHIPPED = mismatch.check
COUNTS = {"checked": 0, "exchanges": 0, "inside_s": 0.0}


def _no_check(group, position, op, fields) -> None:
    COUNTS["checked"] += 1


def _counted(group, position, op, fields) -> None:
    before, start = group.agreement.exchanges, time.perf_counter()
    SHIPPED(group, position, op, fields)
    # an upper bound of the check's cost: its exchange also absorbs the ranks' skew,
    # which the collective after it would otherwise have waited for
    COUNTS["inside_s"] += time.perf_counter() - start
    COUNTS["checked"] += 1
    COUNTS["exchanges"] += group.agreement.exchanges - before


MODES = {"off": _no_check, "on": _counted}


def _timed(mode: str, body: Callable[[], None]) -> tuple[float, float, float, float]:
    """(seconds, collectives, exchanges, seconds inside the check) of body() in `mode`."""
    mismatch.check = MODES[mode]
    COUNTS.update(checked=0, exchanges=0, inside_s=0.0)
    try:
        dist.barrier()  # every rank starts together (torch's own call: not checked)
        start = time.perf_counter()
        body()
        seconds = time.perf_counter() - start
    finally:
        mismatch.check = SHIPPED
    return seconds, COUNTS["checked"], COUNTS["exchanges"], COUNTS["inside_s"]


def _alternating(body: Callable[[], None], trials: int) -> dict[str, dict]:
    """Median seconds per mode over `trials` trials, the modes' order flipped each trial."""
    out: dict[str, dict] = {m: {"trials_s": [], "inside_s": []} for m in MODES}
    for trial in range(trials):
        for mode in list(MODES) if trial % 2 == 0 else list(reversed(MODES)):
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
    n = comm.get_world().world_size
    rows = []
    for numel in (1, 1 << 18, 1 << 20):  # 4 B, 1 MiB, 4 MiB of fp32
        full = torch.randn(numel * n)
        shard = torch.empty(numel)
        small = torch.randn(numel)
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
    ap.add_argument("--skip", default="", help="comma-separated parts to skip")
    ap.add_argument("--out", help="append one json line per row (rank 0)")
    args = ap.parse_args()
    world = comm.init()
    if world.world_size < 2:
        raise SystemExit(
            "mismatch_overhead.py: needs 2 ranks or more (a group of one never checks): "
            "python -m torch.distributed.run --nproc_per_node 2 ..."
        )
    skip = set(filter(None, args.skip.split(",")))
    rows = []
    if "note" not in skip:
        rows.append({"part": "note", "us_per_call": note_cost() * 1e6})
    if "collective" not in skip:
        rows += collective_rows(args.iters, args.trials)
    if "step" not in skip:
        rows.append(step_row(args))
    if world.rank == 0:
        for row in rows:
            row["world"] = world.world_size
            print(json.dumps(row), flush=True)
            if args.out:
                with open(args.out, "a") as f:
                    f.write(json.dumps(row) + "\n")
    comm.destroy()


if __name__ == "__main__":
    main()
