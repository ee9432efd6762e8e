"""The engine's async file I/O beside dd, and its two backends beside each other:
same file system, same run.

    python benchmarks/io/bench_io.py --dir /tmp --gib 1 --rounds 3 \\
        [--backend both] [--request-mib 8,64] [--inflight 4] [--machine "..."] \\
        [--out benchmarks/results/io/<date>_<machine>.md]

Writes and reads --gib GiB: megalith (4 threads, 8 MiB blocks) with O_DIRECT from a
4096-aligned engine buffer, then buffered with an fsync after the write; dd with
bs=8M oflag=direct / iflag=direct, and buffered with conv=fsync. megalith cuts the
transfer into requests of each --request-mib size and keeps --inflight of them in
flight, on each --backend (threads: a pool of pread/pwrite threads; uring: one
io_uring); the backends alternate which goes first from round to round. Reads after
a write come partly from the page cache in buffered mode; O_DIRECT reads do not.
"""

from __future__ import annotations

import argparse
import datetime
import os
import statistics
import subprocess
import tempfile
import time
from collections import deque
from pathlib import Path

import torch

from megalith import _engine

BLOCK_BYTES = 8 << 20


def _dd(args: list[str], nbytes: int) -> float:
    t0 = time.perf_counter()
    subprocess.run(["dd", *args, "bs=8M", f"count={nbytes >> 23}", "status=none"], check=True)
    return nbytes / (time.perf_counter() - t0) / 1e9


def _megalith(
    io: _engine.io.AsyncIO, path: Path, t: torch.Tensor, write: bool, request: int, inflight: int
) -> float:
    """GB/s of moving all of `t` in requests of `request` bytes, `inflight` at a time."""
    nbytes = t.numel()
    pending: deque = deque()
    t0 = time.perf_counter()
    for offset in range(0, nbytes, request):
        if len(pending) == inflight:
            pending.popleft().wait()
        part = t[offset : offset + request]
        pending.append(io.write(path, offset, part) if write else io.read(path, offset, part))
    while pending:
        pending.popleft().wait()
    if write and not io.direct:
        fd = os.open(path, os.O_RDONLY)
        os.fsync(fd)
        os.close(fd)
    return nbytes / (time.perf_counter() - t0) / 1e9


def _filesystem(directory: str) -> str:
    """'<type> (<device>)' from `df -T`."""
    out = subprocess.run(["df", "-T", directory], capture_output=True, text=True).stdout
    fields = out.splitlines()[-1].split() if out.strip() else []
    return f"{fields[1]} ({fields[0]})" if len(fields) >= 2 else "unknown"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", default=tempfile.gettempdir())
    ap.add_argument("--gib", type=float, default=1.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--backend", choices=("threads", "uring", "both"), default="both")
    ap.add_argument("--request-mib", default="8,64", help="request sizes, comma-separated")
    ap.add_argument("--inflight", type=int, default=4, help="megalith requests in flight")
    ap.add_argument("--machine", default="", help="described in the report's header")
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    n = int(a.gib * (1 << 30)) >> 23 << 23
    backends = ("threads", "uring") if a.backend == "both" else (a.backend,)
    requests = [int(m) << 20 for m in a.request_mib.split(",")]
    path = Path(a.dir) / f"megalith-io-bench-{os.getpid()}"
    buf = _engine.memory.HostResource().allocate(n, 4096)
    t = torch.from_dlpack(buf.view("u8", n))
    t.random_(0, 255)  # also faults the pages in before anything is timed
    engines = {
        (b, direct): _engine.io.AsyncIO(
            threads=4, block_bytes=BLOCK_BYTES, direct=direct, backend=b
        )
        for b in backends
        for direct in (True, False)
    }
    rows: dict[str, list[float]] = {}

    def add(key: str, value: float) -> None:
        rows.setdefault(key, []).append(value)

    def megalith(what: str, direct: bool, write: bool, order: tuple[str, ...]) -> None:
        for request in requests:
            for b in order:
                tool = f"megalith {b}, {request >> 20} MiB requests x{a.inflight}"
                io = engines[(b, direct)]
                add(f"{what} | {tool}", _megalith(io, path, t, write, request, a.inflight))

    try:
        for r in range(a.rounds):
            order = backends if r % 2 == 0 else backends[::-1]
            add("O_DIRECT write | dd", _dd(["if=/dev/zero", f"of={path}", "oflag=direct"], n))
            megalith("O_DIRECT write", True, True, order)
            add("O_DIRECT read | dd", _dd([f"if={path}", "of=/dev/null", "iflag=direct"], n))
            megalith("O_DIRECT read", True, False, order)
            add("buffered write + fsync | dd", _dd(["if=/dev/zero", f"of={path}", "conv=fsync"], n))
            megalith("buffered write + fsync", False, True, order)
    finally:
        path.unlink(missing_ok=True)
    header = [
        f"# Engine async file I/O: backends beside each other and dd, {n >> 20} MiB "
        f"in {a.dir}, {a.rounds} rounds (GB/s, median [min-max])",
        "",
        f"- date: {datetime.date.today().isoformat()}",
        f"- machine: {a.machine or os.uname().nodename}, {os.cpu_count()} CPUs",
        f"- filesystem of {a.dir} (df -T): {_filesystem(a.dir)}",
        f"- megalith: 4 threads, {BLOCK_BYTES >> 20} MiB blocks, queue depth 64 (uring), "
        f"4096-aligned engine buffer; io_uring here: "
        f"{_engine.io.uring_unavailable_reason() or 'available'}",
        "",
        "| transfer | tool | GB/s |",
        "|---|---|---|",
    ]
    lines = header
    for key, v in rows.items():
        what, tool = key.split(" | ")
        lines.append(
            f"| {what} | {tool} | {statistics.median(v):.2f} [{min(v):.2f}-{max(v):.2f}] |"
        )
    text = "\n".join(lines) + "\n"
    print(text)
    if a.out:
        Path(a.out).write_text(text)


if __name__ == "__main__":
    main()
