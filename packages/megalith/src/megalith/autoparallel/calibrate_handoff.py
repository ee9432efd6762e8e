"""What a pipeline pass's hand-over between ranks costs beyond the message, timed here:
the profile's `pipeline_handoff_s`, seconds per pass whose input comes from another rank.

A pass that takes a message waits for the rank that sends it. Ranks with a core each
find the sender at work and pay the message alone (send_recv). Ranks that outnumber
the cores (CPU ranks: 4 on 2 cores, beside other jobs) find it descheduled: the pass
waits until the scheduler runs the sender again, and its own core may go to another
rank meanwhile. Neither the compute term (rates measured while every rank computes)
nor the message's alpha-beta sees that wait.

The micro-benchmark: the ranks calibrate runs collectives on, one thread each, in a
ring that behaves as a pipeline in its steady state: every round each rank computes
for a fixed time (a pass's work: ROUND_MATMULS matmuls of WIDTH), sends its output to
the next rank and waits for the previous rank's. Then the same rounds without the
messages (every rank computing at once, the oversubscribed rate the compute term has).
The hand-over is the difference per round, less the measured one-way message; >= 0.
"""

from __future__ import annotations

import statistics
import time

import torch

#: one round's compute (a pipeline pass's work, milliseconds on a CPU core) and message
ROUND_MATMULS, WIDTH, MESSAGE_ROWS = 4, 192, 64
#: rounds per timing and timings per measure (their median)
ROUNDS, REPEATS = 24, 5


def _compute(a: torch.Tensor) -> torch.Tensor:
    out = a
    for _ in range(ROUND_MATMULS):
        out = torch.tanh(out @ a)
    return out


def handoff_rank(rank: int, rounds: int, repeats: int) -> dict[str, list[float]]:
    """One rank's part (run by megalith.testing.run_distributed): seconds per round
    of the ring with messages and of the compute alone, one figure per repetition."""
    import megalith_comm as comm

    world = comm.get_world()
    n, device = world.world_size, world.device
    torch.manual_seed(rank)
    a = torch.randn(WIDTH, WIDTH, device=device) / WIDTH**0.5
    message = torch.randn(MESSAGE_ROWS, WIDTH, device=device)
    nxt, prev = (rank + 1) % n, (rank - 1) % n

    def ring() -> None:
        received = comm.recv(prev, async_op=True)
        _compute(a)
        sent = comm.send(message, nxt, async_op=True)
        received.wait()
        sent.wait()

    timings: dict[str, list[float]] = {"ring": [], "compute": []}
    for name, one in (("ring", ring), ("compute", lambda: _compute(a))):
        one()  # warm-up
        for _ in range(repeats):
            comm.barrier()
            start = time.perf_counter()
            for _ in range(rounds):
                one()
            timings[name].append((time.perf_counter() - start) / rounds)
        comm.barrier()
    return timings


def pipeline_handoff_s(nproc: int, backend: str, message_s: float, quick: bool = False) -> float:
    """Seconds a pass's hand-over from another rank costs beyond its message
    (message_s: the profile's one-way send_recv of MESSAGE_ROWS x WIDTH fp32), over nproc
    ranks; 0.0 for fewer than 2 ranks."""
    if nproc < 2:
        return 0.0
    from megalith.testing import run_distributed

    repeats = 3 if quick else REPEATS
    results = run_distributed(handoff_rank, nproc, ROUNDS, repeats, backend=backend, timeout=180.0)
    # the slowest rank's round sets the ring's pace
    ring = statistics.median(max(r["ring"][i] for r in results) for i in range(repeats))
    alone = statistics.median(max(r["compute"][i] for r in results) for i in range(repeats))
    return max(0.0, ring - alone - message_s)
