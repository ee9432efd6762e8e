"""Collective latency and bandwidth per group size over the real transport: ranks
spawned on this machine (megalith.testing: Gloo on CPU ranks, the engine's NCCL with
one GPU per rank), each collective timed at a few message sizes on groups of the first
g ranks, and time = latency + bytes / bandwidth fitted to them.

Bytes are the whole buffer, as nccl-tests counts them: the all-reduced tensor, the
reduce-scatter's input, the all-gather's output, the broadcast tensor, the message
sent, one rank's send buffer of an all-to-all (Ulysses' exchange); so bandwidth is nccl-tests' algbw (profiles.py turns it into a per-link rate).
"""

from __future__ import annotations

import time

import torch

from .types import AlphaBeta

OPS = ("all_reduce", "reduce_scatter", "all_gather", "broadcast", "send_recv", "all_to_all")


def fit_alpha_beta(points: list[tuple[int, float]]) -> AlphaBeta:
    """Least squares of seconds = latency + bytes / bandwidth over (bytes, seconds)."""
    xs, ts = [float(x) for x, _ in points], [t for _, t in points]
    mx, mt = sum(xs) / len(xs), sum(ts) / len(ts)
    var = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (t - mt) for x, t in zip(xs, ts, strict=True)) / var if var else 0.0
    if slope <= 0:  # noise flattened the line: the largest message's own rate
        slope = ts[xs.index(max(xs))] / max(xs)
    latency = mt - slope * mx
    # A negative intercept is timing noise on a latency below resolution: keep a
    # positive floor, a tenth of the smallest message's time.
    return AlphaBeta(latency_s=max(latency, min(ts) / 10), bandwidth=1.0 / slope)


def _time_op(op: str, group, nbytes: int, device: torch.device, reps: int) -> float:
    import megalith_comm as comm

    g = group.size
    numel = max(g, nbytes // 4 // g * g)
    buf = torch.ones(numel, device=device)
    shard = torch.ones(numel // g, device=device)
    received = torch.empty_like(buf)
    me = group.rank

    def once() -> None:
        if op == "all_reduce":
            comm.all_reduce(buf, group=group)
        elif op == "reduce_scatter":
            comm.reduce_scatter(shard, buf, group=group)
        elif op == "all_gather":
            comm.all_gather(buf, shard, group=group)
        elif op == "all_to_all":
            comm.all_to_all(received, buf, group=group)
        elif op == "broadcast":
            comm.broadcast(buf, src=group.ranks[0], group=group)
        elif me == 0:  # send_recv: a ping-pong, half a round trip each way
            comm.send(buf, group.ranks[1], group=group)
            comm.recv(group.ranks[1], group=group, device=device)
        elif me == 1:
            comm.recv(group.ranks[0], group=group, device=device)
            comm.send(buf, group.ranks[0], group=group)

    once()
    comm.barrier(group=group)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    for _ in range(reps):
        once()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    seconds = (time.perf_counter() - start) / reps
    return seconds / 2 if op == "send_recv" else seconds


def collective_rank(rank: int, sizes: list[int], messages: list[int], reps: int) -> dict:
    """One rank's part (run by megalith.testing.run_distributed); rank 0 returns
    {op: {g: [(bytes, seconds), ...]}}, the other ranks {}."""
    import megalith_comm as comm

    device = comm.get_world().device
    timings: dict[str, dict[str, list[tuple[int, float]]]] = {op: {} for op in OPS}
    for g in sizes:
        group = comm.new_group(list(range(g)), name=f"calibrate{g}")
        if group is not None:
            for op in OPS:
                if op == "send_recv" and g != 2:
                    continue
                points = [(n, _time_op(op, group, n, device, reps)) for n in messages]
                timings[op][str(g)] = points
        comm.barrier()
    return timings if rank == 0 else {}


def measure_collectives(nproc: int, backend: str, quick: bool) -> dict[str, dict[str, AlphaBeta]]:
    """{op: {group size: AlphaBeta}} over nproc ranks (group sizes 2..nproc)."""
    if nproc < 2:
        return {}
    from megalith.testing import run_distributed

    if backend == "nccl":
        messages, reps = [1 << 20, 16 << 20, 128 << 20], 5 if quick else 10
    else:
        messages, reps = [16 << 10, 256 << 10, 2 << 20], 3 if quick else 6
    sizes = list(range(2, nproc + 1))
    results = run_distributed(
        collective_rank, nproc, sizes, messages, reps, backend=backend, timeout=180.0
    )
    return {
        op: {g: fit_alpha_beta(points) for g, points in by_size.items()}
        for op, by_size in results[0].items()
        if by_size
    }
