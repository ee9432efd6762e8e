"""What each rank runs in tests/colossalai's data-parallel plugin tests.

Every worker also runs plain single-process torch on the same global batches (each
rank computes it locally), so results come back as differences from torch.
"""

from __future__ import annotations

import copy
import warnings
from pathlib import Path

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
    scale = 2.0**8  # fp16: a first step that does not overflow (and is not skipped)
    if name in ("zero1", "zero2"):
        return LowLevelZeroPlugin(stage=int(name[-1]), precision=precision, initial_scale=scale)
    if name == "gemini":
        return GeminiPlugin(
            precision=precision, enable_gradient_accumulation=True, initial_scale=scale
        )
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


def conv_bn() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 4, 3),
        torch.nn.BatchNorm2d(4),
        torch.nn.ReLU(),
        torch.nn.Flatten(),
        torch.nn.Linear(4 * 4 * 4, 2),
    )


def batch_norm_half(rank: int, setting: tuple[str, str]) -> dict:
    """ColossalAI's resnet tutorial in small: a conv net with BatchNorm under the plugin
    in fp16/bf16 (ddp: the Booster's mixed_precision, torch AMP); two SGD steps against
    fp32 torch with each rank's batch statistics (BatchNorm is not synchronised here)."""
    name, precision = setting
    world = comm.get_world().world_size
    g = torch.Generator().manual_seed(2)
    data = [torch.randn(world * 2, 3, 6, 6, generator=g) for _ in range(2)]
    ref = conv_bn()
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    ref_losses = []
    for x in data:
        losses = [ref(x[r * 2 : (r + 1) * 2]).float().square().mean() for r in range(world)]
        loss = sum(losses) / world
        loss.backward()
        ref_opt.step()
        ref_opt.zero_grad()
        ref_losses.append(float(loss.detach()))
    model = conv_bn()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    if name == "ddp":
        booster = Booster(mixed_precision=precision, plugin=TorchDDPPlugin())
    else:
        booster = Booster(plugin=make_plugin(name, precision))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # TorchDDPPlugin: BatchNorm stays per rank on CPU
        model, opt, *_ = booster.boost(model, opt)
    out = []
    for x in data:
        loss = model(x[rank * 2 : (rank + 1) * 2]).float().square().mean()
        booster.backward(loss, opt)
        opt.step()
        opt.zero_grad()
        total = loss.detach().clone()
        comm.all_reduce(total)
        out.append(float(total) / world)
    bn = model.unwrap()[1]
    rel = max(abs(a - b) / abs(b) for a, b in zip(out, ref_losses))
    return {"rel": rel, "running_mean": str(bn.running_mean.dtype)}


def accumulation(rank: int, name: str) -> float:
    """Two backward passes (half of each rank's batch each) before one step equal one
    backward of the whole batch: gradients accumulate (Gemini's
    enable_gradient_accumulation)."""
    ref = mlp()
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    model = mlp()
    booster = Booster(plugin=make_plugin(name))
    model, opt, *_ = booster.boost(model, torch.optim.SGD(model.parameters(), lr=0.1))
    x, y = batches(1)[0]
    torch.nn.functional.mse_loss(ref(x), y).backward()
    ref_opt.step()
    xs, ys = _mine(x), _mine(y)
    half = len(xs) // 2 or 1
    parts = [(xs[:half], ys[:half]), (xs[half:], ys[half:])]
    for px, py in parts:
        loss = torch.nn.functional.mse_loss(model(px), py, reduction="sum") / len(xs) / 3
        booster.backward(loss, opt)
    opt.step()
    got = model.state_dict(only_rank_0=False) if name == "gemini" else model.unwrap().state_dict()
    return _max_diff(got, ref.state_dict())


def fsdp_checkpoint(rank: int, directory: str) -> dict:
    """TorchFSDPPlugin through the Booster's checkpoint methods (the general checkpoint
    I/O's files, gathered whole): save after two steps, load into a fresh boosted model
    and optimizer, and the next step is the same as without stopping."""
    data = batches(3)

    def setup():
        model = mlp()
        booster = Booster(plugin=TorchFSDPPlugin())
        opt = torch.optim.Adam(model.parameters(), lr=1e-2)
        model, opt, *_ = booster.boost(model, opt)
        return booster, model, opt

    def step(booster, model, opt, x, y):
        booster.backward(torch.nn.functional.mse_loss(model(_mine(x)), _mine(y)), opt)
        opt.step()
        opt.zero_grad()

    booster, model, opt = setup()
    for x, y in data[:2]:
        step(booster, model, opt, x, y)
    booster.save_model(model, f"{directory}/model", shard=True)
    booster.save_optimizer(opt, f"{directory}/optimizer", shard=True)
    b2, m2, o2 = setup()
    b2.load_model(m2, f"{directory}/model")
    b2.load_optimizer(o2, f"{directory}/optimizer")
    loaded = _max_diff(m2.state_dict(), model.state_dict())
    states = _state_diff(o2.state_dict(), opt.state_dict())
    step(booster, model, opt, *data[2])
    step(b2, m2, o2, *data[2])
    return {
        "loaded": loaded,
        "states": states,
        "next": _max_diff(m2.state_dict(), model.state_dict()),
    }


def dataloader_order(rank: int, setting: int) -> dict:
    """prepare_dataloader: ColossalAI's sampler (DistributedSampler at its own seed) and
    the worker seed."""
    from torch.utils.data import DistributedSampler, TensorDataset

    data = TensorDataset(torch.arange(20))
    plugin = TorchDDPPlugin()
    loader = plugin.prepare_dataloader(data, batch_size=3, shuffle=True, drop_last=True)
    got = [int(i) for (b,) in loader for i in b]
    w = comm.get_world()
    want = list(DistributedSampler(data, num_replicas=w.world_size, rank=w.rank, shuffle=True))
    n = len(want) // 3 * 3
    return {
        "same": got == [int(data[i][0]) for i in want[:n]],
        "rank": plugin.rank,
        "size": plugin.world_size,
    }


def released_params(rank: int, _: object) -> dict:
    """GeminiPlugin outside forward: the user's module's parameters are released, and
    reading them neither crashes nor passes for values (NaN, shape kept); its forward
    gathers them again and equals torch's."""
    ref = mlp()
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    booster = Booster(plugin=make_plugin("gemini"))
    mine = mlp()
    model, opt, *_ = booster.boost(mine, torch.optim.SGD(mine.parameters(), lr=0.1))
    x, y = batches(1)[0]
    torch.nn.functional.mse_loss(ref(x), y).backward()
    ref_opt.step()
    booster.backward(torch.nn.functional.mse_loss(model(_mine(x)), _mine(y)), opt)
    opt.step()
    user = model.unwrap()
    shapes = {n: tuple(p.shape) for n, p in user.named_parameters()}
    want_shapes = {n: tuple(p.shape) for n, p in ref.named_parameters()}
    all_nan = all(bool(p.float().isnan().all()) for p in user.parameters())
    with torch.no_grad():
        out = user(x)
        again = user(x)
    return {
        "shapes": shapes == want_shapes,
        "nan": all_nan,
        "forward": float((out - ref(x)).abs().max()),
        "again": float((again - out).abs().max()),
        "state": _max_diff(model.state_dict(only_rank_0=False), ref.state_dict()),
    }


def model_alone(rank: int, setting: tuple[str, str]) -> dict:
    """boost(model) with no optimizer under a ZeRO plugin: forward equals torch's, and
    save_model writes the model's own values."""
    from megalith_core.safetensors_files import TensorReader

    name, directory = setting
    ref = mlp()
    booster = Booster(plugin=make_plugin(name))
    model, opt, *_ = booster.boost(mlp())
    x = batches(1)[0][0]
    with torch.no_grad():
        forward = float((model(x) - ref(x)).abs().max())
    booster.save_model(model, directory, shard=True)
    comm.barrier()
    with TensorReader(Path(directory), "model") as reader:
        saved = {k: reader.get(k) for k in reader.keys()}
    return {"opt": opt is None, "forward": forward, "saved": _max_diff(saved, ref.state_dict())}


def mixed(rank: int, setting: tuple[str, object]) -> object:
    """One process group for several kinds of check: (worker name, its setting)."""
    kind, arg = setting
    return globals()[kind](rank, arg)
