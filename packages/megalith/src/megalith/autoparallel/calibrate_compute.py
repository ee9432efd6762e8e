"""What one device and its host can do, timed here: matmul per dtype and shape class,
attention, memory bandwidth, the engine's CPU Adam, pinned transfers each way, disk.

Every figure is the best of a few timed repetitions after a warm-up (the rate a kernel
reaches when nothing else disturbs it, which is what the cost model composes). On CPU
ranks each measure runs on the rank's share of the cores (cores / ranks, as
megalith.testing and torchrun give each rank), so the figures are per rank.
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
#: (m, n, k) per shape class; the classes are MachineProfile's (m*n*k < 2**27, < 2**33)
GPU_SHAPES = {
    "small": [(256, 256, 256), (512, 512, 256)],
    "medium": [(1024, 1024, 1024), (2048, 2048, 1024)],
    "large": [(4096, 4096, 4096), (8192, 8192, 4096)],
}
CPU_SHAPES = {
    "small": [(128, 256, 256), (256, 256, 256)],
    "medium": [(512, 512, 512), (1024, 1024, 512)],
    "large": [(2048, 2048, 2048)],
}


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def best_time(
    fn: Callable[[], object], device: torch.device, reps: int = 3, least_s: float = 0.02
) -> float:
    """Seconds per call: the fastest of `reps` timings, each of enough calls to last at
    least `least_s` (so microsecond kernels are not timed by the launch alone)."""
    fn()
    sync(device)
    start = time.perf_counter()
    fn()
    sync(device)
    calls = max(1, min(1000, int(least_s / max(time.perf_counter() - start, 1e-9))))
    best = float("inf")
    for _ in range(reps):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        sync(device)
        best = min(best, (time.perf_counter() - start) / calls)
    return best


def matmul_rates(
    device: torch.device, dtypes: list[str], quick: bool
) -> dict[str, dict[str, float]]:
    """FLOP/s per dtype and shape class: the mean over the class's shapes of 2mnk / t."""
    shapes = GPU_SHAPES if device.type == "cuda" else CPU_SHAPES
    rates: dict[str, dict[str, float]] = {}
    for name in dtypes:
        rates[name] = {}
        for cls, sizes in shapes.items():
            measured = []
            for m, n, k in sizes[:1] if quick else sizes:
                a = torch.randn(m, k, device=device, dtype=DTYPES[name])
                b = torch.randn(k, n, device=device, dtype=DTYPES[name])
                measured.append(2 * m * n * k / best_time(lambda a=a, b=b: a @ b, device))
            rates[name][cls] = sum(measured) / len(measured)
    return rates


def attention_rates(device: torch.device, dtypes: list[str], quick: bool) -> dict[str, float]:
    """FLOP/s of causal SDPA forward, counted as the analysis counts it: 4 h s^2 d, with
    no discount for the mask."""
    if device.type == "cuda":
        heads, seq, dim = 32, 2048 if quick else 4096, 128
    else:
        heads, seq, dim = 8, 256 if quick else 1024, 64
    rates = {}
    for name in dtypes:
        q, k, v = (
            torch.randn(1, heads, seq, dim, device=device, dtype=DTYPES[name]) for _ in range(3)
        )
        seconds = best_time(
            lambda q=q, k=k, v=v: F.scaled_dot_product_attention(q, k, v, is_causal=True), device
        )
        rates[name] = 4 * heads * seq * seq * dim / seconds
    return rates


def copy_bandwidth(device: torch.device, nbytes: int) -> float:
    """Device memory bytes/s of a copy, counting what it reads and what it writes."""
    src = torch.empty(nbytes // 4, device=device, dtype=torch.float32).fill_(1.0)
    dst = torch.empty_like(src)
    return 2 * nbytes / best_time(lambda: dst.copy_(src), device)


def host_adam_rate(numel: int) -> float:
    """Parameters per second of one step of the engine's CPU Adam on host tensors."""
    from megalith_core.optim import CPUAdam

    p = torch.nn.Parameter(torch.randn(numel))
    p.grad = torch.randn(numel)
    opt = CPUAdam([p], lr=1e-3)
    return numel / best_time(opt.step, torch.device("cpu"), reps=3, least_s=0.0)


def transfer_bandwidths(device: torch.device, nbytes: int) -> tuple[float, float]:
    """(host to device, device to host) bytes/s between pinned host memory and the GPU.
    On a CPU rank "the device" is host memory: a host copy's rate stands for both."""
    if device.type != "cuda":
        src = torch.empty(nbytes // 4).fill_(1.0)
        dst = torch.empty_like(src)
        rate = nbytes / best_time(lambda: dst.copy_(src), device)
        return rate, rate
    host = torch.empty(nbytes // 4, pin_memory=True).fill_(1.0)
    dev = torch.empty(nbytes // 4, device=device)
    h2d = nbytes / best_time(lambda: dev.copy_(host, non_blocking=True), device)
    d2h = nbytes / best_time(lambda: host.copy_(dev, non_blocking=True), device)
    return h2d, d2h


def disk_bandwidths(nbytes: int, folder: str | None = None) -> tuple[float, float]:
    """(read, write) bytes/s of a file in `folder` (default: the temp folder): written
    and fsync'd, dropped from the page cache, read back."""
    block = os.urandom(1 << 20) * 4  # 4 MiB of incompressible bytes
    fd, path = tempfile.mkstemp(prefix="megalith-calibrate-", dir=folder)
    try:
        start = time.perf_counter()
        for _ in range(max(1, nbytes // len(block))):
            os.write(fd, block)
        os.fsync(fd)
        write = nbytes / (time.perf_counter() - start)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.lseek(fd, 0, os.SEEK_SET)
        start = time.perf_counter()
        while os.read(fd, len(block)):
            pass
        read = nbytes / (time.perf_counter() - start)
    finally:
        os.close(fd)
        os.unlink(path)
    return read, write
