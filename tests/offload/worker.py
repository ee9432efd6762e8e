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
    param_tier: str = "host"  # OffloadConfig(param_tier=...): "nvme" keeps them in swap files
    prefetch: int = 1  # ZeroConfig(prefetch=...)
    visit_frac: float | str = 0.0  # OffloadConfig(visit_frac=...): host chunks the device updates
    master_tier: str = "host"  # OffloadConfig(master_tier=...): "nvme" puts masters in the files


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
        param_tier=case.param_tier,
        visit_frac=case.visit_frac,
        master_tier=case.master_tier,
    )


def zero_config(case: Case) -> zero.ZeroConfig:
    return zero.ZeroConfig(
        stage=case.stage,
        precision=case.precision,
        chunk_bytes=case.chunk_bytes,
        offload=offload_config(case),
        step_in_backward=case.eager,
        overlap_param_gather=case.overlap_gather,
        prefetch=case.prefetch,
    )


def shard_or_error(model, opt, config: zero.ZeroConfig) -> tuple[str, bool]:
    """shard() that must fail: (its error message, whether the model kept its own values,
    i.e. no broadcast ran before the check)."""
    before = {k: v.detach().clone() for k, v in model.state_dict().items()}
    try:
        zero.shard(model, opt, config)
    except ValueError as e:
        after = model.state_dict()
        return str(e), all(torch.equal(before[k], after[k]) for k in before)
    return "no error", False


def _train(rank: int, case: Case):
    n = comm.get_world().world_size
    model = toy.make_model(0).to(case.device)
    opt = torch.optim.AdamW(toy.param_groups(model, 0.1), lr=1e-2)
    zmodel, zopt = zero.shard(model, opt, zero_config(case))
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
    host = next((t for t in zopt.tiers if t.name == "host"), None)
    return {
        "losses": losses,
        "params": state if rank == 0 else None,
        "report": report,
        # host chunks the device updated (OffloadConfig.visit_frac)
        "visited": [c.spec.index for c in zopt.trainable if host and host.visiting(c)],
        "visits_ran": zopt.visits is not None,
        "visit_frac": zopt.visit_frac,  # as given, or as chosen (visit_frac="auto")
        "visit_timing": zopt.visit_timing,
        "tiers": tiers,
        "swap_removed": gone,
        "swap_used": swap is not None,
        "prefetched": store.prefetched if store else 0,
        # per trainable chunk: (shard in a swap file, shard bytes, shard's device type)
        "param_shards": [
            (
                getattr(c, "params_on_nvme", False),
                c.spec.shard_numel * c.shard.element_size(),
                c.shard.device.type,
            )
            for c in zmodel.chunks
            if c.trainable
        ],
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


@dataclass(frozen=True)
class Resume:
    """Train `case` to step save_at, checkpoint ("sharded": save_sharded; "full":
    save_full and save_full_optimizer) into `path`, then shard a fresh model of other
    values, load the checkpoint and train on to case.steps."""

    case: Case
    kind: str
    path: str
    save_at: int = 10


def _shard(case: Case, seed: int):
    model = toy.make_model(seed)
    opt = torch.optim.AdamW(toy.param_groups(model, 0.1), lr=1e-2)
    return zero.shard(model, opt, zero_config(case))


def _save(kind: str, zmodel, zopt, path: str) -> None:
    if kind == "sharded":
        zero.save_sharded(zmodel, zopt, path)
    else:
        zero.save_full(zmodel, f"{path}/model", max_shard_bytes=4096)
        zero.save_full_optimizer(zmodel, zopt, f"{path}/optim", max_shard_bytes=4096)


def _load(kind: str, zmodel, zopt, path: str) -> None:
    if kind == "sharded":
        zero.load_sharded(zmodel, zopt, path)
    else:
        zero.load_full(zmodel, zopt, f"{path}/model")
        zero.load_full_optimizer(zmodel, zopt, f"{path}/optim")


def resume(rank: int, run: Resume) -> dict:
    """Per-step losses (the first run's, then the resumed one's) and the final params."""
    data = toy.batches(0, run.case.steps, 1)
    losses = []
    zmodel, zopt = _shard(run.case, 0)
    for micro in data[: run.save_at]:
        losses.append(toy.zero_step(zmodel, zopt, *micro[0]))
    _save(run.kind, zmodel, zopt, run.path)
    zopt.close()
    zmodel, zopt = _shard(run.case, 3)  # other initial values: the load must replace them
    _load(run.kind, zmodel, zopt, run.path)
    for micro in data[run.save_at :]:
        losses.append(toy.zero_step(zmodel, zopt, *micro[0]))
    state = zmodel.full_state_dict()
    zopt.close()
    return {"losses": losses, "params": state if rank == 0 else None}


def refused(rank: int, case: Case):
    """shard() with a configuration it must refuse: (the error's message, whether this
    rank's parameters kept their own values, i.e. no broadcast ran). Each rank builds a
    different model."""
    model = toy.make_model(rank)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    config = zero.ZeroConfig(
        stage=case.stage, chunk_bytes=case.chunk_bytes, offload=offload_config(case)
    )
    return shard_or_error(model, opt, config)


@dataclass(frozen=True)
class Refused:
    """A case shard() must refuse (see refused)."""

    case: Case


def dispatch(rank: int, setting: Case | Resume | Refused):
    """One run_grid function for a grid of mixed settings (one process group for all)."""
    if isinstance(setting, Resume):
        return resume(rank, setting)
    if isinstance(setting, Refused):
        return refused(rank, setting.case)
    return train(rank, setting)
