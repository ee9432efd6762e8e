"""Rank workers: HybridParallelPlugin's gradient clipping and fp16 loss scaling span the
whole model under tp, pp and ZeRO.

ClipCase: the norm clip_grad_by_norm returns is the one torch's clip_grad_norm_ gives on
the unsharded model in one process (1e-5 relative), max_norm is small enough that
clipping is active, and SGD (whose update, unlike Adam's, is proportional to the clipped
gradient) ends with the reference's weights (1e-5).

Fp16SkipCase: an inf injected into one gradient on one rank only (global rank 1, tp
rank 1) at one step; every rank must skip that step (skipped_steps, unchanged weights,
the same loss scale), replicas stay bit-equal over dp and tp, and the run ends near an
fp32 run that skipped the same step.

Fp16Case: fp16 training over a few steps against the fp32 model in one process.
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass

import torch

import megalith_comm as comm
from megalith.booster import Booster
from megalith.booster.plugin import HybridParallelPlugin
from megalith.tensor_parallel import gather_full
from tests.tensor_parallel import pipeline_plugin as pp_models
from tests.tensor_parallel.common import check, exact_entries
from tests.tensor_parallel.models import SEQ, VOCAB, ModelCase, build, loss_of

LR = 0.5  # SGD: large enough that the clipped step moves the weights visibly


def _plugin(case, **extra) -> HybridParallelPlugin:
    kwargs = dict(tp_size=case.tp, zero_stage=case.zero_stage, **extra)
    if case.pp > 1:
        kwargs.update(pp_size=case.pp, pp_style=getattr(case, "style", "1f1b"), num_microbatches=2)
    return HybridParallelPlugin(**kwargs)


@dataclass(frozen=True)
class ClipCase:
    """max_norm through clip_grad_by_norm (and through step() on the last step)."""

    tp: int = 2
    pp: int = 1
    zero_stage: int = 1
    family: str = "llama"  # megalith.models without pp, transformers' with pp
    style: str = "1f1b"
    max_norm: float = 0.05
    steps: int = 2

    def run(self, rank: int) -> tuple[list[str], float]:
        start = time.perf_counter()
        if self.pp > 1:
            ref = pp_models.build(self.family, 4)
        else:
            ref = build(ModelCase("megalith", self.family))
        model = copy.deepcopy(ref)
        plugin = _plugin(self, max_norm=self.max_norm)
        booster = Booster(plugin=plugin)
        model, opt, *_ = booster.boost(model, torch.optim.SGD(model.parameters(), lr=LR))
        opt_ref = torch.optim.SGD(ref.parameters(), lr=LR)
        dp_rank, dp = plugin.dp_rank_size
        gen = torch.Generator().manual_seed(7)
        errors: list[str] = []
        case = ModelCase("megalith", self.family)
        for step in range(self.steps):
            ids = torch.randint(0, VOCAB, (4 * dp, SEQ), generator=gen)
            if self.pp > 1:
                ref(input_ids=ids, labels=ids).loss.backward()
            else:
                loss_of(ref, ids, case, None).backward()
            want = torch.nn.utils.clip_grad_norm_(ref.parameters(), self.max_norm)
            if not want > 2 * self.max_norm:
                errors.append(f"step {step}: norm {float(want):.3g}, clipping not active")
            opt_ref.step()
            opt_ref.zero_grad()
            mine = ids.chunk(dp)[dp_rank]
            if self.pp > 1:
                batch = {"input_ids": mine, "labels": mine}
                booster.execute_pipeline(iter([batch]), model, pp_models.criterion, opt)
            else:
                opt.backward(loss_of(model, mine, case, None))
            if step < self.steps - 1:  # the last step clips inside step() (max_norm)
                norm = opt.clip_grad_by_norm(self.max_norm)
                check(errors, f"norm at step {step}", torch.tensor(norm), want.detach())
            opt.step()
            opt.zero_grad()
        _check_weights(errors, plugin, model, ref, 1e-5)
        return errors, time.perf_counter() - start


def _check_weights(errors, plugin, model, ref, tol: float) -> None:
    ref_params = dict(ref.named_parameters())
    tp_group = plugin.mesh.group("tp")
    mine = plugin.local_named_parameters(model)
    for name, p in mine.items():
        full, want = gather_full(p, tp_group), ref_params[name].detach()
        keep = exact_entries(name, want)
        check(errors, f"weight {name}", full[keep].float(), want[keep], tol)


def _inject_inf(model, plugin, steps_to_break: set[int], counter: list[int]) -> None:
    """On global rank 1 (tp rank 1, or pp rank 1 without tp): the first tp-sharded (or
    first) parameter's gradient becomes inf in the backward of the listed steps."""
    if comm.get_world().rank != 1:
        return
    local = list(model.unwrap().parameters())
    p = next((p for p in local if hasattr(p, "tp_spec")), local[0])
    p.register_hook(lambda g: g * float("inf") if counter[0] in steps_to_break else g)


def _replicas_equal(errors: list[str], plugin, model) -> None:
    """Every parameter equal over dp, every tp-replicated one equal over tp (bit for bit)."""
    groups = [("dp", None), ("tp", "replicated")]
    for axis, only in groups:
        group = plugin.mesh.group(axis)
        if group.size == 1:
            continue
        for name, p in model.unwrap().named_parameters():
            if only and hasattr(p, "tp_spec"):
                continue
            mine = p.detach().float().contiguous()
            every = torch.empty((group.size, *mine.shape))
            comm.all_gather(every, mine, group=group)
            if not all(torch.equal(every[0], x) for x in every[1:]):
                errors.append(f"{name} differs over {axis}")


class _Llama:
    """The reference model and the step, with or without a pipeline."""

    def __init__(self, pp: int):
        self.pp = pp
        self.case = ModelCase("megalith", "llama")

    def build(self) -> torch.nn.Module:
        return pp_models.build("llama", 4) if self.pp > 1 else build(self.case)

    def loss(self, model, ids: torch.Tensor) -> torch.Tensor:
        if self.pp > 1:
            return model(input_ids=ids, labels=ids).loss
        return loss_of(model, ids, self.case, None)

    def backward(self, booster, model, opt, ids: torch.Tensor) -> torch.Tensor:
        """This dp rank's forward and backward; its (unscaled) loss."""
        if self.pp > 1:
            batch = {"input_ids": ids, "labels": ids}
            out = booster.execute_pipeline(iter([batch]), model, pp_models.criterion, opt)
            return out["loss"].detach()
        loss = self.loss(model, ids)
        opt.backward(loss)
        return loss.detach()


def _skipped(opt) -> int:
    inner = getattr(opt, "zero_optimizer", opt)
    return inner.skipped_steps


@dataclass(frozen=True)
class Fp16SkipCase:
    """An fp16 overflow on one rank only skips the step on every rank."""

    tp: int = 2
    pp: int = 1
    zero_stage: int = 0
    steps: int = 3
    broken: int = 1  # the step whose gradients overflow on rank 1
    resume: bool = False  # the backed-off loss scale survives save_optimizer / load_optimizer

    def run(self, rank: int) -> tuple[list[str], float]:
        start = time.perf_counter()
        llama = _Llama(self.pp)
        ref = llama.build()
        model = copy.deepcopy(ref)
        plugin = _plugin(self, precision="fp16", initial_scale=2**10, hysteresis=1)
        booster = Booster(plugin=plugin)
        model, opt, *_ = booster.boost(
            model, torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.1)
        )
        opt_ref = torch.optim.AdamW(ref.parameters(), lr=1e-3, weight_decay=0.1)
        counter = [0]
        _inject_inf(model, plugin, {self.broken}, counter)
        dp_rank, dp = plugin.dp_rank_size
        gen = torch.Generator().manual_seed(5)
        errors: list[str] = []
        for step in range(self.steps):
            counter[0] = step
            ids = torch.randint(0, VOCAB, (2 * dp, SEQ), generator=gen)
            if step != self.broken:  # the reference skips the same step
                llama.loss(ref, ids).backward()
                opt_ref.step()
                opt_ref.zero_grad()
            before = [p.detach().clone() for p in model.unwrap().parameters()]
            scale = opt.loss_scale
            llama.backward(booster, model, opt, ids.chunk(dp)[dp_rank])
            opt.step()
            opt.zero_grad()
            want = 1 if step >= self.broken else 0
            if _skipped(opt) != want:
                errors.append(f"step {step}: skipped_steps {_skipped(opt)}, expected {want}")
            if step == self.broken:
                after = list(model.unwrap().parameters())
                if not all(torch.equal(a, b.detach()) for a, b in zip(before, after)):
                    errors.append(f"step {step}: weights changed in a skipped step")
                if not opt.loss_scale < scale:
                    errors.append(f"step {step}: loss scale {opt.loss_scale} did not back off")
            scales = torch.tensor([opt.loss_scale], dtype=torch.float64)
            every = torch.empty(comm.get_world().world_size, dtype=torch.float64)
            comm.all_gather(every, scales)
            if not torch.all(every == every[0]):
                errors.append(f"step {step}: loss scales differ over ranks: {every.tolist()}")
        _replicas_equal(errors, plugin, model)
        _check_weights(errors, plugin, model, ref, 2e-2)
        if self.resume:
            self._check_resume(booster, opt, llama, errors)
        return errors, time.perf_counter() - start

    def _check_resume(self, booster, opt, llama, errors: list[str]) -> None:
        import os
        import shutil
        import tempfile

        path = os.path.join(tempfile.gettempdir(), f"megalith-fp16-{os.getppid()}-{self.pp}")
        booster.save_optimizer(opt, path)
        plugin = _plugin(self, precision="fp16", initial_scale=2**10, hysteresis=1)
        other = Booster(plugin=plugin)
        fresh = llama.build()
        _, fresh_opt, *_ = other.boost(
            fresh, torch.optim.AdamW(fresh.parameters(), lr=1e-3, weight_decay=0.1)
        )
        if fresh_opt.loss_scale == opt.loss_scale:
            errors.append(f"resume: the scale {opt.loss_scale} is the initial one; test is moot")
        other.load_optimizer(fresh_opt, path)
        if fresh_opt.loss_scale != opt.loss_scale:
            errors.append(f"resume: loss scale {fresh_opt.loss_scale}, saved {opt.loss_scale}")
        comm.barrier()
        if comm.get_world().rank == 0:
            if os.path.isdir(path):
                shutil.rmtree(path, ignore_errors=True)
            elif os.path.exists(path):  # an unsharded optimizer save is one file
                os.remove(path)


@dataclass(frozen=True)
class Fp16Case:
    """fp16 (dynamic loss scale) over a few AdamW steps against fp32 in one process:
    losses within FP16_LOSS_TOL and weights within FP16_WEIGHT_TOL relative."""

    tp: int = 2
    pp: int = 1
    zero_stage: int = 0
    max_norm: float = 0.0
    steps: int = 4

    def run(self, rank: int) -> tuple[list[str], float]:
        start = time.perf_counter()
        llama = _Llama(self.pp)
        ref = llama.build()
        model = copy.deepcopy(ref)
        plugin = _plugin(self, precision="fp16", initial_scale=2**10, max_norm=self.max_norm)
        booster = Booster(plugin=plugin)
        model, opt, *_ = booster.boost(
            model, torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.1)
        )
        opt_ref = torch.optim.AdamW(ref.parameters(), lr=1e-3, weight_decay=0.1)
        dp_rank, dp = plugin.dp_rank_size
        gen = torch.Generator().manual_seed(5)
        errors: list[str] = []
        for step in range(self.steps):
            ids = torch.randint(0, VOCAB, (2 * dp, SEQ), generator=gen)
            want = llama.loss(ref, ids)
            want.backward()
            if self.max_norm:
                want_norm = torch.nn.utils.clip_grad_norm_(ref.parameters(), self.max_norm)
            opt_ref.step()
            opt_ref.zero_grad()
            loss = llama.backward(booster, model, opt, ids.chunk(dp)[dp_rank])
            mean = loss.float().reshape(1).clone()
            comm.all_reduce(mean, op="avg", group=plugin.mesh.group("dp"))
            check(errors, f"loss at step {step}", mean[0], want.detach(), FP16_LOSS_TOL)
            if self.max_norm:  # the unscaled norm: the loss scale was applied and removed
                norm = torch.tensor(opt.clip_grad_by_norm(self.max_norm))
                check(errors, f"norm at step {step}", norm, want_norm, FP16_NORM_TOL)
            opt.step()
            opt.zero_grad()
        if _skipped(opt):
            errors.append(f"{_skipped(opt)} steps skipped at loss scale 2**10")
        _replicas_equal(errors, plugin, model)
        _check_weights(errors, plugin, model, ref, FP16_WEIGHT_TOL)
        return errors, time.perf_counter() - start


# Measured on CPU (tp 2, pp 2, zero_stage 0, 1, 2): losses within 1e-5, weights within
# 4e-3, gradient norms within 3e-4
# (Adam turns the fp16 rounding of small gradients into lr-sized differences).
FP16_LOSS_TOL = 1e-4
FP16_WEIGHT_TOL = 1e-2
FP16_NORM_TOL = 2e-3
