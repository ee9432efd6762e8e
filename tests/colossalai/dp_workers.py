"""What each rank runs in tests/colossalai's data-parallel plugin tests.

Every worker also runs plain single-process torch on the same global batches (each
rank computes it locally), so results come back as differences from torch.
"""

from __future__ import annotations

import copy
import warnings

import torch

import megalith_comm as comm
from megalith.booster import Booster
from megalith.booster.plugin import (
    GeminiPlugin,
    LowLevelZeroPlugin,
    TorchDDPPlugin,
    TorchFSDPPlugin,
)

GLOBAL_BATCH = 6  # divisible by world sizes 2 and 3


def make_plugin(name: str, precision: str = "fp32"):
    if name == "ddp":
        return TorchDDPPlugin()
    if name in ("zero1", "zero2"):
        return LowLevelZeroPlugin(stage=int(name[-1]), precision=precision)
    if name == "gemini":
        return GeminiPlugin(precision=precision, enable_gradient_accumulation=True)
    if name == "fsdp":
        return TorchFSDPPlugin()
    raise ValueError(name)


def mlp() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))


def batches(steps: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    return [
        (torch.randn(GLOBAL_BATCH, 6, generator=g), torch.randn(GLOBAL_BATCH, 3, generator=g))
        for _ in range(steps)
    ]


def _mine(t: torch.Tensor) -> torch.Tensor:
    w = comm.get_world()
    n = GLOBAL_BATCH // w.world_size
    return t[w.rank * n : (w.rank + 1) * n]


def _max_diff(a: dict, b: dict) -> float:
    return max(float((a[k].float() - b[k].float()).abs().max()) for k in b)


def _state_diff(a: dict, b: dict) -> float:
    """Largest difference between two torch-form optimizer state dicts' tensors."""
    if sorted(a["state"]) != sorted(b["state"]):
        return float("inf")
    worst = 0.0
    for i, sb in b["state"].items():
        sa = a["state"][i]
        if sorted(sa) != sorted(sb):
            return float("inf")
        for k in sb:
            worst = max(
                worst,
                float(
                    (torch.as_tensor(sa[k]).float() - torch.as_tensor(sb[k]).float()).abs().max()
                ),
            )
    return worst


def boosted_objects(rank: int, name: str) -> dict:
    """Three steps under the plugin and in plain torch: loss, the get_grad_norm of each
    step, clipping by norm and by value, backward_by_grad, an LR scheduler built before
    boost, the optimizer's state_dict against torch's, load_state_dict of a changed
    torch state dict then one more step, and the model's state dict."""
    ref = mlp()
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-2, weight_decay=0.1)
    ref_sched = torch.optim.lr_scheduler.StepLR(ref_opt, step_size=1, gamma=0.5)
    model = mlp()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)  # before boost
    booster = Booster(plugin=make_plugin(name))
    with warnings.catch_warnings():
        warnings.simplefilter(
            "error", UserWarning
        )  # e.g. "lr_scheduler.step() before optimizer.step()"
        model, opt, _, _, sched = booster.boost(model, opt, lr_scheduler=sched)
        out: dict = {"loss": [], "norm": [], "lr": []}
        data = batches(4)
        for step, (x, y) in enumerate(data[:3]):
            ref_loss = torch.nn.functional.mse_loss(ref(x), y)
            ref_loss.backward()
            loss = torch.nn.functional.mse_loss(model(_mine(x)), _mine(y))
            if step == 0:
                opt.backward_by_grad(loss, torch.ones_like(loss))
            else:
                booster.backward(loss, opt)
            ref_norm = float(torch.nn.utils.get_total_norm([p.grad for p in ref.parameters()]))
            if step == 1:
                torch.nn.utils.clip_grad_norm_(ref.parameters(), 0.05)
                out["clip"] = float(opt.clip_grad_by_norm(0.05)) - ref_norm
            if step == 2:
                torch.nn.utils.clip_grad_value_(ref.parameters(), 0.01)
                opt.clip_grad_by_value(0.01)  # the step's gradients: their norm is reported
                ref_norm = float(torch.nn.utils.get_total_norm([p.grad for p in ref.parameters()]))
            ref_opt.step()
            opt.step()
            out["norm"].append(opt.get_grad_norm() - ref_norm)
            loss_all = loss.detach().clone()
            comm.all_reduce(loss_all)
            out["loss"].append(
                float(loss_all) / comm.get_world().world_size - float(ref_loss.detach())
            )
            ref_opt.zero_grad()
            opt.zero_grad()
            ref_sched.step()
            sched.step()
            out["lr"].append(opt.param_groups[0]["lr"] - ref_opt.param_groups[0]["lr"])
    if name == "gemini":  # GeminiOptimizer's default: gathered on rank 0 only
        out["opt_rank0_only"] = (opt.state_dict()["state"] == {}) == (rank != 0)
        out["state"] = _state_diff(opt.state_dict(only_rank_0=False), ref_opt.state_dict())
    else:
        out["state"] = _state_diff(opt.state_dict(), ref_opt.state_dict())
    changed = copy.deepcopy(ref_opt.state_dict())
    for s in changed["state"].values():
        s["exp_avg"] = s["exp_avg"] * 0.5 + 0.01
    ref_opt.load_state_dict(copy.deepcopy(changed))
    opt.load_state_dict(changed)
    x, y = data[3]
    torch.nn.functional.mse_loss(ref(x), y).backward()
    booster.backward(torch.nn.functional.mse_loss(model(_mine(x)), _mine(y)), opt)
    ref_opt.step()
    opt.step()
    want = ref.state_dict()
    if name == "ddp":  # DDP's own state_dict keys are prefixed (module.module.), as ColossalAI's
        got = model.unwrap().state_dict()
    elif name == "gemini":
        got = model.state_dict(only_rank_0=False)
    else:
        got = model.state_dict()
    out["params"] = _max_diff({k: v.cpu() for k, v in got.items()}, want)
    if name == "gemini":
        out["rank0_only_empty"] = (model.state_dict() == {}) == (rank != 0)
        fresh = {k: v + 0.25 for k, v in want.items()}
        model.load_state_dict(fresh)
        out["load"] = _max_diff(model.state_dict(only_rank_0=False), fresh)
    out["unwrap"] = type(model.unwrap()).__name__
    out["unwrap_opt"] = opt.unwrap() is opt.optim
    return out
