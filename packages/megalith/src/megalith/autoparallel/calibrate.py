"""calibrate(): a MachineProfile of the machine this runs on, measured in under two
minutes (under one with quick=True on a small CPU box).

    profile = calibrate()                      # GPUs when there are, else CPU ranks
    profile = calibrate("cpu", quick=True, nproc=4)
    print(format_profile(profile)); profile.save("profile.json")

calibrate_compute.py times the single-device parts, calibrate_comm.py the collectives
over nproc spawned ranks. On CPU ranks "device memory" is the rank's share of host
memory and the transfer rates are host copies (there is no PCIe between them).
"""

from __future__ import annotations

import os
import platform
import socket
import time

import torch

from . import calibrate_compute as compute
from .calibrate_comm import measure_collectives
from .calibrate_handoff import MESSAGE_ROWS, WIDTH, pipeline_handoff_s
from .calibrate_pass import pipeline_pass_s
from .calibrate_split import split_backward_call_s
from .types import MachineProfile

MiB = 1 << 20


def _host_memory() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "cpu"


def calibrate(
    device: str = "auto",
    quick: bool = False,
    nproc: int | None = None,
    disk_dir: str | None = None,
    log=None,
) -> MachineProfile:
    """Measures this machine. device: "auto" (cuda when there is a GPU), "cuda" or
    "cpu"; nproc: ranks for the collectives (default: every GPU, or 2 CPU ranks);
    disk_dir: where the disk test file goes (default: the temp folder); log: a
    callable given one line per measure as it finishes."""
    started = time.perf_counter()
    say = log or (lambda line: None)
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device not in ("cuda", "cpu"):
        raise ValueError(f"calibrate: device must be 'auto', 'cuda' or 'cpu', got {device!r}")
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("calibrate: device='cuda' but torch sees no GPU; use device='cpu'")
    gpus = torch.cuda.device_count() if device == "cuda" else 0
    nproc = nproc if nproc is not None else (gpus if device == "cuda" else 2)
    if nproc < 1 or (device == "cuda" and nproc > gpus):
        raise ValueError(
            f"calibrate: nproc={nproc} but this machine has {gpus} GPU(s); "
            "give at most one rank per GPU (or device='cpu' for CPU ranks)"
        )
    dev = torch.device("cuda", 0) if device == "cuda" else torch.device("cpu")
    threads = torch.get_num_threads()
    if device == "cpu":  # each rank's share of the cores, as its ranks will run
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // nproc))
    try:
        dtypes = ["bf16", "fp16", "fp32"] if device == "cuda" else (["fp32"] if quick else ["fp32", "bf16"])  # fmt: skip
        matmul = compute.matmul_rates(dev, dtypes, quick)
        say(f"matmul done ({time.perf_counter() - started:.1f} s)")
        attention = compute.attention_rates(
            dev, [d for d in dtypes if d != "fp16"] or dtypes, quick
        )
        memory = compute.copy_bandwidth(
            dev, (1024 if device == "cuda" else 64 if quick else 256) * MiB
        )
        h2d, d2h = compute.transfer_bandwidths(dev, (64 if quick else 256) * MiB)
        adam = compute.host_adam_rate((4 if quick else 16) * MiB)
        split_call = split_backward_call_s(dev, reps=7 if quick else 15)
        pass_s = pipeline_pass_s(dev, reps=5 if quick else 9)
        say(
            f"attention, memory, transfers, host Adam, split backward, pipeline pass done "
            f"({time.perf_counter() - started:.1f} s)"
        )
    finally:
        torch.set_num_threads(threads)
    disk_read, disk_write = compute.disk_bandwidths((64 if quick else 256) * MiB, disk_dir)
    say(f"disk done ({time.perf_counter() - started:.1f} s)")
    backend = "nccl" if device == "cuda" else "gloo"
    collectives = measure_collectives(nproc, backend, quick)
    say(f"collectives done ({time.perf_counter() - started:.1f} s)")
    message = collectives.get("send_recv", {}).get("2")
    message_s = message.time(MESSAGE_ROWS * WIDTH * 4) if message else 0.0
    handoff = pipeline_handoff_s(nproc, backend, message_s, quick)
    elapsed = time.perf_counter() - started
    say(f"pipeline hand-over done ({elapsed:.1f} s)")
    host = _host_memory()
    if device == "cuda":
        name, per_device = torch.cuda.get_device_name(0), torch.cuda.mem_get_info(0)[1]
    else:
        name, per_device = _cpu_name(), host // nproc
    flags = f"{' --quick' if quick else ''} --nproc {nproc}"
    return MachineProfile(
        name=socket.gethostname(),
        device=device,
        device_name=name,
        devices_per_node=gpus if device == "cuda" else nproc,
        device_memory_bytes=per_device,
        host_memory_bytes=host,
        matmul=matmul,
        attention=attention,
        memory_bandwidth=memory,
        host_adam_params_per_s=adam,
        h2d_bandwidth=h2d,
        d2h_bandwidth=d2h,
        disk_read_bandwidth=disk_read,
        disk_write_bandwidth=disk_write,
        collectives=collectives,
        transport="nccl" if device == "cuda" else "gloo",
        split_backward_call_s=split_call,
        pipeline_pass_s=pass_s,
        pipeline_handoff_s=handoff,
        measured=(
            f"megalith calibrate{flags} on {socket.gethostname()}, "
            f"{time.strftime('%Y-%m-%d %H:%M %Z')}, torch {torch.__version__}, {elapsed:.0f} s"
        ),
    )


def _rate(x: float, unit: str) -> str:
    for scale, prefix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if x >= scale:
            return f"{x / scale:.1f} {prefix}{unit}"
    return f"{x:.3g} {unit}"


def format_profile(p: MachineProfile) -> str:
    """The profile as a table for a terminal."""
    rows = [
        ("device", f"{p.device_name} ({p.device}, {p.devices_per_node} per node)"),
        (
            "memory",
            f"{p.device_memory_bytes / 1e9:.1f} GB per device, host {p.host_memory_bytes / 1e9:.1f} GB",
        ),
    ]
    for dtype, classes in p.matmul.items():
        rows.append((f"matmul {dtype}", ", ".join(f"{c} {_rate(r, 'FLOP/s')}" for c, r in classes.items())))  # fmt: skip
    rows += [(f"attention {d}", _rate(r, "FLOP/s")) for d, r in p.attention.items()]
    rows += [
        ("memory bandwidth", _rate(p.memory_bandwidth, "B/s")),
        ("host Adam", _rate(p.host_adam_params_per_s, "params/s")),
        ("h2d / d2h", f"{_rate(p.h2d_bandwidth, 'B/s')} / {_rate(p.d2h_bandwidth, 'B/s')}"),
        ("split backward", f"{p.split_backward_call_s * 1e6:.1f} us per W call"),
        ("pipeline pass", f"{p.pipeline_pass_s * 1e6:.1f} us per pass"),
        ("pipeline hand-over", f"{p.pipeline_handoff_s * 1e6:.1f} us per pass from another rank"),
        (
            "disk read / write",
            f"{_rate(p.disk_read_bandwidth, 'B/s')} / {_rate(p.disk_write_bandwidth, 'B/s')}",
        ),
    ]
    for op, sizes in p.collectives.items():
        for g, ab in sizes.items():
            rows.append((f"{op} g={g}", f"{ab.latency_s * 1e6:.1f} us + bytes / {_rate(ab.bandwidth, 'B/s')}"))  # fmt: skip
    width = max(len(k) for k, _ in rows)
    lines = [f"{k:<{width}}  {v}" for k, v in rows]
    return "\n".join(
        [f"machine profile {p.name} ({p.transport})", *lines, f"measured: {p.measured}"]
    )
