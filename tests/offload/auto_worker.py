"""What each rank runs in the automatic-placement tests: the toy model (tests/zero/toy.py)
under ZeRO with OffloadConfig(placement="auto") and a simulated device budget."""

from __future__ import annotations

from dataclasses import dataclass

import torch

import megalith_zero as zero
from megalith_offload import OffloadConfig

from ..booster.toy_loop import train_toy
from ..zero import toy
from .worker import shard_or_error

#: the device-tier kinds of the engine's accounting (CPU ranks: gathered is engine-tallied)
DEVICE_KINDS = ("params", "grads", "grads_in_flight", "gathered", "master", "optim_states")


@dataclass(frozen=True)
class Auto:
    stage: int
    budget: int | None = None  # None: no offloading (the baseline)
    tier: str = "host"
    precision: str = "fp32"
    steps: int = 12
    swap_dir: str = ""
    headroom: float = 0.1
    chunk_bytes: int = 2048  # small: many chunks, shards cut through parameters
    #: fp16: a loss scale that overflows the first step, then backs off to 2**10: the
    #: warm-up step is skipped and no optimizer state exists when the chunks move
    overflow_first: bool = False
    master_tier: str = "host"  # "nvme": NVMe chunks' masters in their files until moved


def _config(case: Auto) -> zero.ZeroConfig:
    offload = None
    if case.budget is not None:
        offload = OffloadConfig(
            tier=case.tier,
            placement="auto",
            device_budget_bytes=case.budget,
            headroom=case.headroom,
            swap_dir=case.swap_dir or None,
            run_name="auto",
            master_tier=case.master_tier,
        )
    scale = zero.LossScaleConfig()
    if case.overflow_first:
        scale = zero.LossScaleConfig(initial=2.0**40, max_scale=2.0**40, backoff=2.0**-30)
    return zero.ZeroConfig(
        stage=case.stage,
        precision=case.precision,
        chunk_bytes=case.chunk_bytes,
        offload=offload,
        loss_scale=scale,
    )


def _device_peak(report) -> int:
    return sum(report[k].peak_bytes for k in DEVICE_KINDS)


def train(rank: int, case: Auto):
    """Trains; a dict of results, or ("error", type, message) when it fails."""
    model = toy.make_model(0)
    opt = torch.optim.AdamW(toy.param_groups(model, 0.1), lr=1e-2)
    try:
        zmodel, zopt = zero.shard(model, opt, _config(case))
    except (ValueError, MemoryError) as e:
        return ("error", type(e).__name__, str(e))
    losses, out = [], {}
    try:
        for step, micro in enumerate(toy.batches(0, case.steps, 1), start=1):
            losses.append(toy.zero_step(zmodel, zopt, *micro[0]))
            if step == 1 and zopt.placement is not None:
                p = zopt.placement
                out["warmup_peak"] = _device_peak(zmodel.memory_report())
                out["footprint"] = (p.footprint.non_model, dict(p.footprint.model))
                out["room"], out["moved"] = p.room, list(p.moved)
                out["params_moved"] = list(p.params_moved)  # stage 3: shards moved back
                out["warmup_skipped"] = zopt.skipped_steps
                zmodel.memory.reset_peak()  # the placed steps' peaks from here on
    except (ValueError, MemoryError) as e:
        zopt.close()
        return ("error", type(e).__name__, str(e))
    report = zmodel.memory_report()
    state = zmodel.full_state_dict()  # collective: every rank
    out.update(
        losses=losses,
        params=state if rank == 0 else None,
        tiers=[c.tier for c in zmodel.chunks if c.trainable],
        report={k: (u.current_bytes, u.peak_bytes) for k, u in report.items()},
        device_peak=_device_peak(report),
        kept_bytes=zopt.placement.kept_bytes if zopt.placement else 0,  # stage 3: kept gathered
        # masters and states on the device tier, per trainable chunk (0: offloaded)
        chunk_device=[
            4 * c.spec.shard_numel * (len(c.states) + (c.shard.dtype != torch.float32))
            if c.tier == "device"
            else 0
            for c in zmodel.chunks
            if c.trainable
        ],
        swap_files=zopt.offloader.swap.nbytes if zopt.offloader and zopt.offloader.swap else 0,
        # per trainable chunk: its working-parameter shard's bytes, and whether it is on the
        # host (stage 3: the warm-up puts every shard there)
        shard_bytes=[
            c.shard.numel() * c.shard.element_size() for c in zmodel.chunks if c.trainable
        ],
        params_on_host=[c.params_on_host for c in zmodel.chunks if c.trainable],
        shards_on_device=[
            c.spec.index for c in zmodel.chunks if c.trainable and not c.params_on_host
        ],
    )
    zopt.close()
    return out


def unbroadcast(rank: int, budget: int):
    """shard() with a budget too small: (error message, whether this rank's parameters
    kept their own values, i.e. no broadcast ran). Each rank builds a different model."""
    model = toy.make_model(rank)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    config = zero.ZeroConfig(
        stage=2,
        chunk_bytes=2048,
        offload=OffloadConfig(placement="auto", device_budget_bytes=budget),
    )
    return shard_or_error(model, opt, config)


@dataclass(frozen=True)
class Boosted:
    """GeminiPlugin (stage 3, fp32) with auto placement set through set_offload."""

    budget: int | None = None  # None: no offloading
    steps: int = 8
    save_at: int = 0
    save_dir: str = ""
    resume: str = ""


def boosted(rank: int, run: Boosted):
    """Rank 0 returns (per-step losses, tiers of the trainable chunks at the end)."""
    from megalith.booster import Booster, GeminiPlugin

    model = toy.make_model(5)
    opt = torch.optim.AdamW(toy.param_groups(model, 0.1), lr=1e-2)
    plugin = GeminiPlugin(precision="fp32")
    if run.budget is not None:
        plugin.set_offload(tier="host", placement="auto", device_budget_bytes=run.budget)
    booster = Booster(plugin=plugin)
    model, opt, *_ = booster.boost(model, opt)
    # a resume loads before the warm-up: into the offload tier, moved after it
    losses = train_toy(rank, booster, model, opt, run)
    tiers = [c.tier for c in opt.zero_optimizer.chunks if c.trainable]
    opt.zero_optimizer.close()
    return (losses, tiers) if rank == 0 else None
