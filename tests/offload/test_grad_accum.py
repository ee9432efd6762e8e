"""Gradient accumulation with offloaded states equals one batch k times the size.

Through the Booster (LowLevelZeroPlugin(cpu_offload=True), set_offload, GeminiPlugin(
offload_optim_frac=1.0)), k micro-batches per optimizer step (all but the last under
booster.no_sync at ZeRO-2; Gemini's pattern, k plain backwards, too) must give plain
torch's parameters after one batch of all k micro-batches' rows, within fp32 rounding.
The host update runs once per chunk per optimizer step, never during a micro-batch
but the last: with the update in backward (the plugins' default here) it starts during
the last micro-batch's backward.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

import megalith_comm as comm
from megalith.booster import Booster, GeminiPlugin, LowLevelZeroPlugin
from megalith.testing import run_grid
from tests.zero import toy

STEPS = 2


@dataclass(frozen=True)
class Accum:
    plugin: str  # "zero2" (cpu_offload=True), "zero2-nvme" (set_offload tier nvme), "gemini"
    k: int  # micro-batches per optimizer step
    no_sync: bool = True  # all but the last micro-batch under booster.no_sync
    step_in_backward: bool | None = None  # set_offload's; None: the plugin's default

    @property
    def updates_in_backward(self) -> bool:
        """What the plugin chooses: the update in backward for offload that neither clips
        nor scales, unless Gemini accumulates plain backwards, NVMe chunks (their states
        are read in step()) or step_in_backward=False say otherwise."""
        if self.step_in_backward is not None:
            return self.step_in_backward
        return self.plugin == "zero2" or (self.plugin == "gemini" and self.no_sync)


def _plugin(run: Accum, swap_dir: str):
    if run.plugin == "gemini":
        plugin = GeminiPlugin(
            precision="fp32", offload_optim_frac=1.0, enable_gradient_accumulation=not run.no_sync
        )
        if run.step_in_backward is not None:
            plugin.set_offload(optim_frac=1.0, step_in_backward=run.step_in_backward)
        return plugin
    plugin = LowLevelZeroPlugin(stage=2, precision="fp32", cpu_offload=True)
    if run.plugin == "zero2-nvme":
        plugin.set_offload(tier="nvme", swap_dir=swap_dir, run_name="accum")
    elif run.step_in_backward is not None:
        plugin.set_offload(tier="host", step_in_backward=run.step_in_backward)
    return plugin


def _train(rank: int, setting: tuple[Accum, str]) -> dict:
    """STEPS optimizer steps of run.k micro-batches each, splitting this rank's rows of
    toy's batch; returns the full parameters and, per host update, (step, phase): the
    micro-batch whose backward queued it, or run.k for step()."""
    run, swap_dir = setting
    n = comm.get_world().world_size
    model = toy.make_model(0)
    opt = torch.optim.AdamW(toy.param_groups(model, 0.1), lr=1e-2)
    booster = Booster(plugin=_plugin(run, swap_dir))
    model, opt, *_ = booster.boost(model, opt)
    zopt = opt.zero_optimizer
    where = {"step": 0, "phase": 0}
    accumulating = []  # after each no_sync backward: where the gradients wait
    updates: list[tuple[int, int]] = []
    for tier in zopt.tiers:
        stepper = getattr(tier, "stepper", None)
        if stepper is not None:
            submit = stepper.submit

            def counted(*args, _submit=submit):
                updates.append((where["step"], where["phase"]))
                return _submit(*args)

            stepper.submit = counted
    rows = toy.BATCH // n
    per_micro = rows // run.k
    for step, micro in enumerate(toy.batches(0, STEPS, 1)):
        x, y = (t[rank * rows : (rank + 1) * rows] for t in micro[0])
        where["step"] = step
        for i in range(run.k):
            part = slice(i * per_micro, (i + 1) * per_micro)
            where["phase"] = i
            loss = toy.loss_fn(model, x[part], y[part]) / run.k
            if run.no_sync and i < run.k - 1:
                with booster.no_sync(model, opt):
                    booster.backward(loss, opt)
                accumulating.append(_where_grads_wait(zopt))
            else:
                booster.backward(loss, opt)
        where["phase"] = run.k
        opt.step()
        opt.zero_grad()
    offloaded = sum(1 for c in zopt.trainable if c.tier != "device")
    params = model.state_dict(only_rank_0=False) if run.plugin == "gemini" else None
    if params is None:
        params = {k: v.clone() for k, v in model.unwrap().state_dict().items()}
    zopt.close()
    return {
        "params": params,
        "updates": updates,
        "offloaded": offloaded,
        "accumulating": accumulating,
    }


def _where_grads_wait(zopt) -> str:
    """ "whole": every chunk that got gradients keeps them in its full-size buffer on the
    device, unreduced; "shard": already moved into its shard (one rank: [Note: local
    accumulation] in megalith_zero/grads.py); "mixed" otherwise."""
    held = [c for c in zopt.trainable if any(c.used)]
    whole = [
        c.full_grad is not None and c.full_grad.device == c.shard_grad.device and not c.grad_valid
        for c in held
    ]
    shard = [c.full_grad is None and c.grad_valid for c in held]
    if held and all(whole):
        return "whole"
    return "shard" if held and all(shard) else "mixed"


def _check(run: Accum, r: dict, ref: dict[str, torch.Tensor], world: int) -> None:
    for name, want in ref.items():
        got = r["params"][name]
        err = float((got.double() - want.double()).norm() / want.double().norm())
        assert err < 1e-5, f"{run}: {name} differs from one large batch by {err:.3g}"
    per_step = [[p for s, p in r["updates"] if s == step] for step in range(STEPS)]
    for phases in per_step:
        assert len(phases) == r["offloaded"], (run, phases)  # one host update per chunk
        assert all(p >= run.k - 1 for p in phases), (run, phases)  # none before the last
        if not run.updates_in_backward:
            assert set(phases) == {run.k}, (run, phases)
    if run.no_sync:
        want = "shard" if world == 1 else "whole"
        assert r["accumulating"] == [want] * (STEPS * (run.k - 1)), (run, r["accumulating"])


RUNS = {
    1: [Accum("zero2", 3)],
    2: [
        Accum("zero2", 3),
        Accum("zero2", 2, step_in_backward=False),
        Accum("zero2-nvme", 2),
        Accum("gemini", 2),
        Accum("gemini", 3, no_sync=False),
    ],
    3: [Accum("zero2", 2), Accum("gemini", 2, no_sync=False)],
}


@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_accumulated_offload_equals_one_large_batch(world_size, tmp_path):
    runs = RUNS[world_size]
    results = run_grid(_train, [(r, str(tmp_path)) for r in runs], world_size, timeout=240)
    _, ref = toy.reference(0, STEPS, 1, None)
    for run, per_rank in zip(runs, results):
        for r in per_rank:
            _check(run, r, ref, world_size)
        if run.updates_in_backward:  # the last micro-batch's backward starts them (a chunk
            # whose shard holds a parameter unused here waits for step()'s flags)
            early = {s for r in per_rank for s, p in r["updates"] if p == run.k - 1}
            assert early == set(range(STEPS)), (run, [r["updates"] for r in per_rank])
