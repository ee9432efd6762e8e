"""The engine's async file I/O beside dd, same file system, same run.

    python benchmarks/io/bench_io.py --dir /tmp --gib 1 --rounds 3 [--out benchmarks/results/io_<date>.md]

Writes and reads --gib GiB: megalith (4 threads, 8 MiB blocks) with O_DIRECT from a
4096-aligned engine buffer, then buffered with an fsync after the write; dd with
bs=8M oflag=direct / iflag=direct, and buffered with conv=fsync. Reads after a
write come partly from the page cache in buffered mode; O_DIRECT reads do not.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import torch

from megalith import _engine


def _dd(args: list[str], nbytes: int) -> float:
    t0 = time.perf_counter()
    subprocess.run(["dd", *args, "bs=8M", f"count={nbytes >> 23}", "status=none"], check=True)
    return nbytes / (time.perf_counter() - t0) / 1e9


def _megalith(path: Path, nbytes: int, direct: bool, write: bool) -> float:
    io = _engine.io.AsyncIO(threads=4, block_bytes=8 << 20, direct=direct)
    buf = _engine.memory.HostResource().allocate(nbytes, 4096)
    t = torch.from_dlpack(buf.view("u8", nbytes))
    if write:
        t.random_(0, 255)
    t0 = time.perf_counter()
    req = io.write(str(path), 0, t) if write else io.read(str(path), 0, t)
    req.wait()
    if write and not direct:
        fd = os.open(path, os.O_RDONLY)
        os.fsync(fd)
        os.close(fd)
    return nbytes / (time.perf_counter() - t0) / 1e9


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", default=tempfile.gettempdir())
    ap.add_argument("--gib", type=float, default=1.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    n = int(a.gib * (1 << 30)) >> 23 << 23
    path = Path(a.dir) / f"megalith-io-bench-{os.getpid()}"
    rows: dict[str, list[float]] = {}

    def add(key: str, value: float) -> None:
        rows.setdefault(key, []).append(value)

    try:
        for _ in range(a.rounds):
            add("O_DIRECT write | dd", _dd(["if=/dev/zero", f"of={path}", "oflag=direct"], n))
            add("O_DIRECT write | megalith", _megalith(path, n, True, True))
            add("O_DIRECT read | dd", _dd([f"if={path}", "of=/dev/null", "iflag=direct"], n))
            add("O_DIRECT read | megalith", _megalith(path, n, True, False))
            add("buffered write + fsync | dd", _dd(["if=/dev/zero", f"of={path}", "conv=fsync"], n))
            add("buffered write + fsync | megalith", _megalith(path, n, False, True))
    finally:
        path.unlink(missing_ok=True)
    lines = [
        f"# Engine async file I/O beside dd: {n >> 20} MiB in {a.dir}, {a.rounds} rounds (GB/s, median [min-max])",
        "",
        "| transfer | tool | GB/s |",
        "|---|---|---|",
    ]
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
