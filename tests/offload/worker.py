"""What each rank runs in the offload tests: the toy model (tests/zero/toy.py) under ZeRO,
with its optimizer states on the device, host or NVMe tier."""

from __future__ import annotations

import os
import resource
import signal
from dataclasses import dataclass

import torch

import megalith_comm as comm
import megalith_zero as zero
from megalith_offload import OffloadConfig

from ..zero import toy


@dataclass(frozen=True)
class Case:
    stage: int
    tier: str = "none"  # "none": no offloading (the baseline)
    frac: float = 1.0
    device_budget: int | None = None
    host_budget: int | None = None
    precision: str = "fp32"
    max_norm: float | None = None
    steps: int = 20
    chunk_bytes: int = 2048  # small: many chunks, shards cut through parameters
    swap_dir: str = ""
    fsize_limit: int = 0  # RLIMIT_FSIZE for this rank while training (0: none)
    eager: bool = False  # ZeroConfig(step_in_backward=True)
    param_frac: float = 0.0  # OffloadConfig(param_frac=...): stage 3 parameter shards on the host
    device: str = "cpu"  # "cuda": the model and data on the GPU (tests/test_offload_gpu.py)
    overlap_gather: bool = False  # ZeroConfig(overlap_param_gather=True)


def offload_config(case: Case) -> OffloadConfig | None:
    if case.tier == "none":
        return None
    return OffloadConfig(
        tier=case.tier,
        optim_frac=case.frac,
        device_budget_bytes=case.device_budget,
        host_budget_bytes=case.host_budget,
        swap_dir=case.swap_dir or None,
        run_name="test",
        param_frac=case.param_frac,
    )


def _train(rank: int, case: Case):
    n = comm.get_world().world_size
    model = toy.make_model(0).to(case.device)
    opt = torch.optim.AdamW(toy.param_groups(model, 0.1), lr=1e-2)
    config = zero.ZeroConfig(
        stage=case.stage,
        precision=case.precision,
        chunk_bytes=case.chunk_bytes,
        offload=offload_config(case),
        step_in_backward=case.eager,
        overlap_param_gather=case.overlap_gather,
    )
    zmodel, zopt = zero.shard(model, opt, config)
    try:
        return _run(rank, n, case, zmodel, zopt)
    finally:
        zopt.close()  # as a training script would: the swap directory goes now


def _run(rank: int, n: int, case: Case, zmodel, zopt) -> dict:
    losses = []
    zmodel.memory.reset_peak()
    for micro in toy.batches(0, case.steps, 1):
        x, y = (t.to(case.device) for t in micro[0])
        losses.append(toy.zero_step(zmodel, zopt, x, y, case.max_norm))
    report = {k: (u.current_bytes, u.peak_bytes) for k, u in zmodel.memory_report().items()}
    tiers = [c.tier for c in zmodel.chunks if c.trainable]
    store = zopt.offloader.swap if zopt.offloader else None
    swap = store.path if store else None
    state = {k: v.cpu() for k, v in zmodel.full_state_dict().items()}
    zopt.close()  # idempotent
    gone = swap is None or not os.path.exists(swap)
    return {
        "losses": losses,
        "params": state if rank == 0 else None,
        "report": report,
        "tiers": tiers,
        "swap_removed": gone,
        "swap_used": swap is not None,
        "prefetched": store.prefetched if store else 0,
    }


def train(rank: int, case: Case):
    """Trains; returns a dict of results, or ("error", type, errno, message) when it fails."""
    old = resource.getrlimit(resource.RLIMIT_FSIZE)
    old_handler = signal.getsignal(signal.SIGXFSZ)
    if case.fsize_limit:  # files of at most this many bytes: EFBIG past it, no signal
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (case.fsize_limit, old[1]))
    try:
        return _train(rank, case)
    except (OSError, ValueError, MemoryError) as e:
        return ("error", type(e).__name__, getattr(e, "errno", None), str(e))
    finally:
        if case.fsize_limit:
            resource.setrlimit(resource.RLIMIT_FSIZE, old)
            signal.signal(signal.SIGXFSZ, old_handler)
