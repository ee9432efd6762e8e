"""The ZeRO plugins' internals that ColossalAI's users read, against plain torch.

LowLevelZeroPlugin's boosted optimizer is a megalith.zero.LowLevelZeroOptimizer: each
trainable parameter's fp32 master is this rank's equal slice of it (padded by
get_param_padding_size), `.optim` is the user's torch optimizer whose state_dict()
holds this rank's slices of the optimizer states, get_param_grad is the averaged
gradient; GeminiPlugin's are GeminiDDP (ColoParameters) and GeminiOptimizer. Every
number is compared with torch's Adam on the same model and the whole batch."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

from megalith.testing import run_distributed

WORLD = 2
LR = 1e-2


def _model() -> torch.nn.Module:
    # 7*13 + 13 + 13*5 + 5 elements: none a multiple of 2 * 16, so every one is padded
    return torch.nn.Sequential(torch.nn.Linear(7, 13), torch.nn.Tanh(), torch.nn.Linear(13, 5))


def _batches(seed: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(4, 7, generator=g) for _ in range(WORLD)]


def _slice(t: torch.Tensor, padding: int, rank: int) -> torch.Tensor:
    return F.pad(t.detach().reshape(-1).float(), (0, padding)).chunk(WORLD)[rank]


def _reference_step(seed: int):
    """A fresh model, its copy after one torch Adam step on the whole batch, the
    copy's gradients before the step, the optimizer, and the per-rank batches."""
    torch.manual_seed(seed)
    model = _model()
    ref = copy.deepcopy(model)
    ref_opt = torch.optim.Adam(ref.parameters(), lr=LR)
    xs = _batches(seed)
    torch.stack([ref(x).square().mean() for x in xs]).mean().backward()
    ref_grads = [p.grad.clone() for p in ref.parameters()]
    ref_opt.step()
    return model, ref, ref_opt, ref_grads, xs


def low_level_internals(rank: int, seed: int) -> dict[str, float | bool]:
    from megalith.booster import Booster
    from megalith.booster.plugin import LowLevelZeroPlugin
    from megalith.zero import LowLevelZeroOptimizer

    model, ref, ref_opt, ref_grads, xs = _reference_step(seed)

    user_opt = torch.optim.Adam(model.parameters(), lr=LR)
    booster = Booster(plugin=LowLevelZeroPlugin(stage=2, precision="fp32"))
    model, opt, *_ = booster.boost(model, user_opt)
    params = list(model.unwrap().parameters())
    booster.backward(model(xs[rank]).square().mean(), opt)
    grad = max((opt.get_param_grad(p) - g).abs().max().item() for p, g in zip(params, ref_grads))
    opt.step()

    out: dict[str, float | bool] = {
        "is_low_level": isinstance(opt, LowLevelZeroOptimizer),
        "optim_is_users": opt.optim is user_opt,
        "grad": grad,
        "padded_to_world": all(
            (p.numel() + opt.get_param_padding_size(p)) % WORLD == 0 for p in params
        ),
        "some_padding": any(opt.get_param_padding_size(p) > 0 for p in params),
        "masters_cover": set(opt.working_to_master_param) == {id(p) for p in params},
    }
    master = state = 0.0
    saved = opt.optim.state_dict()["state"]
    ref_state = ref_opt.state_dict()["state"]
    for i, (p, r) in enumerate(zip(params, ref.parameters())):
        pad = opt.get_param_padding_size(p)
        m = opt.working_to_master_param[id(p)]
        out["back_map"] = out.get("back_map", True) and opt.master_to_working_param[id(m)] is p
        master = max(master, (m - _slice(r, pad, rank)).abs().max().item())
        for name in ("exp_avg", "exp_avg_sq"):
            want = _slice(ref_state[i][name], pad, rank)
            state = max(state, (saved[i][name] - want).abs().max().item())
        out["step"] = out.get("step", True) and float(saved[i]["step"]) == 1.0
    out["master"], out["state"] = master, state
    # the masters are the chunks' own tensors: a write shows in the next state_dict
    m0 = opt.working_to_master_param[id(params[0])]
    m0.add_(1.0)
    out["master_live"] = (opt.working_to_master_param[id(params[0])] - m0).abs().max().item()
    return out


@pytest.mark.timeout(90)
def test_low_level_zero_internals_match_torch():
    for r in run_distributed(low_level_internals, WORLD, 3, timeout=80):
        assert r["is_low_level"] and r["optim_is_users"], r
        assert r["padded_to_world"] and r["some_padding"] and r["masters_cover"], r
        assert r["back_map"] and r["step"], r
        assert r["grad"] < 1e-6, r
        assert r["master"] < 1e-5, r
        assert r["state"] < 1e-6, r
        assert r["master_live"] == 0.0, r


def gemini_objects(rank: int, seed: int) -> dict[str, float | bool]:
    from megalith.booster import Booster
    from megalith.booster.plugin import GeminiPlugin
    from megalith.tensor import ColoParameter
    from megalith.zero import GeminiDDP, GeminiOptimizer

    model, ref, ref_opt, _, xs = _reference_step(seed)
    user_opt = torch.optim.Adam(model.parameters(), lr=LR)
    booster = Booster(plugin=GeminiPlugin(precision="fp32"))
    model, opt, *_ = booster.boost(model, user_opt)
    booster.backward(model(xs[rank]).square().mean(), opt)
    opt.step()
    full = model.state_dict(only_rank_0=False)
    # packed chunks: each rank holds segments; their exp_avg_sq sums to the whole one's
    held = sum(s["exp_avg_sq"].sum().item() for s in opt.optim.state.values())
    return {
        "types": isinstance(model, GeminiDDP) and isinstance(opt, GeminiOptimizer),
        "colo": all(isinstance(p, ColoParameter) for p in model.parameters()),
        "optim_is_users": opt.optim is user_opt,
        "params": max((full[k] - v).abs().max().item() for k, v in ref.state_dict().items()),
        "held": held,
        "whole": sum(s["exp_avg_sq"].sum().item() for s in ref_opt.state.values()),
    }


@pytest.mark.timeout(90)
def test_gemini_boosted_types_and_state_views():
    results = run_distributed(gemini_objects, WORLD, 5, timeout=80)
    for r in results:
        assert r["types"] and r["colo"] and r["optim_is_users"], r
        assert r["params"] < 1e-5, r
    held = sum(r["held"] for r in results)
    assert held > 0 and abs(held - results[0]["whole"]) < 1e-4 * results[0]["whole"]


def test_direct_construction_names_the_booster():
    from megalith.zero import GeminiDDP, LowLevelZeroOptimizer, zero_model_wrapper

    opt = torch.optim.SGD(_model().parameters(), lr=0.1)
    for make in (
        lambda: LowLevelZeroOptimizer(opt),
        lambda: GeminiDDP(_model()),
        lambda: zero_model_wrapper(_model(), 3),
    ):
        with pytest.raises(TypeError, match=r"Booster\(plugin="):
            make()


def test_meta_compatibility_and_colo_parameter():
    from megalith.fx import is_compatible_with_meta
    from megalith.tensor import ColoParameter, ColoTensor

    assert is_compatible_with_meta() is True  # torch 2 runs modules on meta tensors
    data = torch.randn(3, 4)
    p = ColoParameter(data, requires_grad=True)
    assert isinstance(p, torch.nn.Parameter) and isinstance(p, ColoTensor)
    assert "ColoParameter" in repr(p) and torch.equal(p.detach(), data)
    assert type(p * 2) is torch.Tensor  # operators give plain tensors
    assert isinstance(copy.deepcopy(p), ColoParameter)
    assert ColoParameter().numel() == 0
