"""nccl-tests-shaped harness: megalith's engine NCCL path beside torch.distributed's
NCCL path, in the same run, one file per collective (all_reduce.py, all_gather.py, ...).

Launch one process per GPU:

    python -m torch.distributed.run --nproc_per_node N benchmarks/comm/all_reduce.py \
        [--out results.jsonl] [-b 8] [-e 256M] [-f 2] [--dtype float32]

A plain `python benchmarks/comm/all_reduce.py` runs at world size 1, where the figure
that matters is per-call latency at small sizes (what a bucketer pays per bucket).

Sizes follow nccl-tests: `size` is the bytes of the larger buffer (all_reduce and
broadcast: the buffer; all_gather: the gathered output; reduce_scatter and all_to_all:
the input), doubling from -b to -e. For each size and path: warm-up calls, then
`--trials` timings of `--iters` back-to-back calls between two CUDA events on the
current stream; the median per-call time is reported, with

    algbw = size / time          busbw = algbw * factor(n)

and factor(n) as nccl-tests: all_reduce 2(n-1)/n; all_gather, reduce_scatter and
all_to_all (n-1)/n; broadcast and reduce 1. `host_us` is the host time per call
(the loop without synchronisation): the engine's per-call overhead at small sizes.
Before timing a size, one call of each path on the same input is compared (--no-check
skips it). The two paths alternate order from trial to trial.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import site
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist

DTYPES = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "float64": torch.float64,
    "int32": torch.int32,
    "int64": torch.int64,
}


def torch_reduce_op(name: str):
    """torch.distributed's ReduceOp for the engine's reduction name."""
    ops = {
        "sum": dist.ReduceOp.SUM,
        "avg": dist.ReduceOp.AVG,
        "min": dist.ReduceOp.MIN,
        "max": dist.ReduceOp.MAX,
        "prod": dist.ReduceOp.PRODUCT,
    }
    return ops[name]


@dataclass(frozen=True)
class Collective:
    """One collective: its buffers for a size, and the call on each path.

    buffers(count, n) -> (send elements, recv elements) for `count` elements of the
    larger buffer at world size n. engine(comm, send, recv, op, stream) and
    torch_op(send, recv, op) issue one call; both may write recv (or send, in place).
    """

    name: str
    busbw_factor: Callable[[int], float]
    buffers: Callable[[int, int], tuple[int, int]]
    engine: Callable
    torch_op: Callable
    in_place: bool = False  # the result is in send (all_reduce, broadcast)
    count_multiple_of_world: bool = False  # count must divide by the world size


def parse_size(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    text = text.strip().upper().rstrip("B")
    if text and text[-1] in units:
        return int(float(text[:-1]) * units[text[-1]])
    return int(text)


def parse_args(name: str) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=f"{name}: megalith engine vs torch.distributed (NCCL)")
    p.add_argument("-b", "--min-bytes", type=parse_size, default=8)
    p.add_argument("-e", "--max-bytes", type=parse_size, default=256 << 20)
    p.add_argument("-f", "--factor", type=int, default=2)
    p.add_argument("-w", "--warmup", type=int, default=10)
    p.add_argument(
        "-n", "--iters", type=int, default=50, help="calls per timing (fewer at big sizes)"
    )
    p.add_argument(
        "--trials", type=int, default=5, help="timings per size and path; the median is kept"
    )
    p.add_argument("--dtype", choices=sorted(DTYPES), default="float32")
    p.add_argument("--op", default="sum", help="reduction of all_reduce / reduce_scatter")
    p.add_argument("--paths", default="megalith,torch", help="comma-separated: megalith, torch")
    p.add_argument("--out", help="append one JSON line per (size, path) here (rank 0)")
    p.add_argument("--no-check", action="store_true", help="skip comparing the paths' results")
    return p.parse_args()


def point_engine_at_nccl(engine) -> None:
    """Use the nvidia-nccl-cu13 wheel's libnccl (the one torch loads) when it is installed."""
    for base in [*site.getsitepackages(), site.getusersitepackages(), *sys.path]:
        for sub in ("nvidia/nccl/lib", "nvidia/cu13/lib"):
            if (Path(base) / sub / "libnccl.so.2").exists():
                engine.set_nccl_search_path(str(Path(base) / sub))
                return


class Setup:
    """torch.distributed (NCCL) plus an engine communicator over the same ranks."""

    def __init__(self) -> None:
        os.environ.setdefault("RANK", "0")
        os.environ.setdefault("WORLD_SIZE", "1")
        os.environ.setdefault("LOCAL_RANK", "0")
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", "29517")
        self.rank = int(os.environ["RANK"])
        self.world = int(os.environ["WORLD_SIZE"])
        self.local_rank = int(os.environ["LOCAL_RANK"])
        torch.cuda.set_device(self.local_rank)
        self.device = torch.device("cuda", self.local_rank)
        dist.init_process_group("nccl", device_id=self.device)

        from megalith import _engine

        point_engine_at_nccl(_engine)
        uid = [_engine.nccl_unique_id() if self.rank == 0 else None]
        dist.broadcast_object_list(uid, src=0)
        self.engine = _engine
        self.comm = _engine.NcclCommunicator(
            uid[0], self.world, self.rank, self.local_rank, timeout_s=600.0, name="bench"
        )

    def sync(self) -> None:
        """Every rank here, and this GPU idle."""
        torch.cuda.synchronize()
        dist.barrier(device_ids=[self.local_rank])
        torch.cuda.synchronize()

    def close(self) -> None:
        self.sync()
        del self.comm
        dist.destroy_process_group()

    def info(self) -> dict:
        return {
            "world_size": self.world,
            "gpu": torch.cuda.get_device_name(self.device),
            "megalith_nccl": self.engine.nccl_version(),
            "torch": torch.__version__,
            "torch_nccl": ".".join(map(str, torch.cuda.nccl.version())),
        }


def make_input(count: int, dtype: torch.dtype, rank: int, device) -> torch.Tensor:
    g = torch.Generator(device=device).manual_seed(1234 + rank)
    if dtype.is_floating_point:
        return torch.randn(count, generator=g, device=device).to(dtype)
    return torch.randint(-100, 100, (count,), generator=g, device=device, dtype=dtype)


def check(coll: Collective, s: Setup, count: int, dtype: torch.dtype, op: str) -> None:
    """One call of each path on the same input gives the same result."""
    n_send, n_recv = coll.buffers(count, s.world)
    base = make_input(n_send, dtype, s.rank, s.device)
    results = []
    for path in ("megalith", "torch"):
        send, recv = base.clone(), torch.zeros(n_recv, dtype=dtype, device=s.device)
        if path == "megalith":
            stream = torch.cuda.current_stream().cuda_stream
            coll.engine(s.comm, send, recv, op, stream).synchronize()
        else:
            coll.torch_op(send, recv, op)
        torch.cuda.synchronize()
        results.append(send if coll.in_place else recv)
    torch.testing.assert_close(
        results[0], results[1], msg=f"{coll.name} count={count}: paths differ"
    )


def time_path(call: Callable[[], object], iters: int) -> tuple[float, float]:
    """(device us per call between two events, host us per call) for `iters` back-to-back calls."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    t0 = time.perf_counter()
    for _ in range(iters):
        call()
    t1 = time.perf_counter()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e3 / iters, (t1 - t0) * 1e6 / iters


def sizes(args: argparse.Namespace) -> list[int]:
    out, size = [], args.min_bytes
    while size <= args.max_bytes:
        out.append(size)
        size *= max(args.factor, 2)
    return out


def measure(coll: Collective, s: Setup, args, count: int, dtype, paths: list[str]) -> dict:
    """{path: median device us, min, host us} for one size; the paths alternate order."""
    n_send, n_recv = coll.buffers(count, s.world)
    send = make_input(n_send, dtype, s.rank, s.device)
    recv = torch.zeros(n_recv, dtype=dtype, device=s.device)
    stream = torch.cuda.current_stream().cuda_stream
    calls = {
        "megalith": lambda: coll.engine(s.comm, send, recv, args.op, stream),
        "torch": lambda: coll.torch_op(send, recv, args.op),
    }
    elem = send.element_size()
    iters = max(5, min(args.iters, (8 << 30) // max(count * elem, 1)))
    timings: dict[str, list[tuple[float, float]]] = {p: [] for p in paths}
    for p in paths:
        for _ in range(args.warmup):
            calls[p]()
    for trial in range(args.trials):
        for p in paths if trial % 2 == 0 else paths[::-1]:
            s.sync()
            timings[p].append(time_path(calls[p], iters))
    return {
        p: {
            "time_us": statistics.median(t[0] for t in timings[p]),
            "time_us_min": min(t[0] for t in timings[p]),
            "host_us": statistics.median(t[1] for t in timings[p]),
            "iters": iters,
        }
        for p in paths
    }


def run(coll: Collective) -> None:
    args = parse_args(coll.name)
    s = Setup()
    dtype = DTYPES[args.dtype]
    elem = torch.tensor([], dtype=dtype).element_size()
    paths = [p.strip() for p in args.paths.split(",") if p.strip()]
    info = s.info()
    rows = []
    if s.rank == 0:
        print(f"# {coll.name}  {info}  dtype={args.dtype} op={args.op}", flush=True)
        print(_header(paths), flush=True)
    for size in sizes(args):
        count = max(size // elem, 1)
        if coll.count_multiple_of_world:
            count = max(count // s.world, 1) * s.world
        if not args.no_check:
            check(coll, s, count, dtype, args.op)
        result = measure(coll, s, args, count, dtype, paths)
        for p in paths:
            algbw = count * elem / (result[p]["time_us"] * 1e-6) / 1e9
            result[p].update(
                bench="comm",
                op=coll.name,
                path=p,
                bytes=count * elem,
                count=count,
                dtype=args.dtype,
                reduction=args.op,
                algbw_GBps=algbw,
                busbw_GBps=algbw * coll.busbw_factor(s.world),
                trials=args.trials,
                date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                **info,
            )
            rows.append(result[p])
        if s.rank == 0:
            print(_line(count * elem, count, paths, result), flush=True)
    if s.rank == 0 and args.out:
        with open(args.out, "a") as f:
            for row in rows:
                f.write(json.dumps(row) + "\n")
    s.close()


def _header(paths: list[str]) -> str:
    cols = "".join(
        f" | {p + ' time(us)':>18} {'algbw':>7} {'busbw':>7} {'host(us)':>9}" for p in paths
    )
    ratio = " | megalith/torch" if {"megalith", "torch"} <= set(paths) else ""
    return f"{'size(B)':>12} {'count':>11}{cols}{ratio}"


def _line(size: int, count: int, paths: list[str], result: dict) -> str:
    cols = "".join(
        f" | {result[p]['time_us']:18.2f} {result[p]['algbw_GBps']:7.2f} "
        f"{result[p]['busbw_GBps']:7.2f} {result[p]['host_us']:9.2f}"
        for p in paths
    )
    ratio = ""
    if {"megalith", "torch"} <= set(paths):
        ratio = f" | {result['megalith']['time_us'] / result['torch']['time_us']:15.3f}"
    return f"{size:12d} {count:11d}{cols}{ratio}"
