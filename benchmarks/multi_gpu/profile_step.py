"""Where a training step's GPU time goes (--profile of zero_vs_fsdp2.py): one step under
torch.profiler, its device kernels split into communication (NCCL), matrix multiplies,
attention, optimizer and the rest, against the step's wall time. The compute stream's
busy time over the wall time says how much of the step the GPU computed; what is left
is communication or host time that nothing hid."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import torch

#: kernel name fragments -> category, first match wins
CATEGORIES = (
    ("comm", ("nccl",)),
    ("attention", ("flash", "fmha", "attention", "sdpa")),
    ("optimizer", ("adam", "multi_tensor", "megalith")),
    ("matmul", ("gemm", "cutlass", "sm90_xmma", "nvjet", "cublas", "matmul")),
)


def category(name: str) -> str:
    low = name.lower()
    for label, parts in CATEGORIES:
        if any(p in low for p in parts):
            return label
    return "other"


def profile_step(run: Callable[[], object], out: Path) -> dict[str, float]:
    """Runs run() once under the profiler (CUDA only); writes the top kernels and the
    per-category device seconds to out; returns {category: seconds, "wall": seconds}."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        start = time.perf_counter()
        run()
        torch.cuda.synchronize()
        wall = time.perf_counter() - start
    totals = {label: 0.0 for label, _ in CATEGORIES} | {"other": 0.0}
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    for e in kernels:
        totals[category(e.name)] += e.time_range.elapsed_us() / 1e6
    totals["wall"] = wall
    compute = sum(v for k, v in totals.items() if k not in ("comm", "wall"))
    lines = [
        f"step wall {wall:.4f} s; device kernels by kind (s, summed over streams):",
        *(f"  {k:10s} {v:.4f}" for k, v in totals.items() if k != "wall"),
        f"  compute (all but comm) / wall = {compute / wall:.3f}",
        "",
        prof.key_averages().table(sort_by="device_time_total", row_limit=30),
    ]
    out.write_text("\n".join(lines))
    return totals
