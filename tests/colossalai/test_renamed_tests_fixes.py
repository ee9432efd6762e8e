"""Regressions found by running ColossalAI's own booster, checkpoint-IO and lr-scheduler
tests with the import renamed (docs/COLOSSALAI.md, "ColossalAI's own tests, renamed"):
a second CosineAnnealingWarmupLR leaves a stepped optimizer's lr alone, boost() puts the
adapters of an optimizer built before enable_lora into their base weight's group, and
the module paths colossalai.lazy.lazy_init and colossalai.booster.accelerator exist."""

from __future__ import annotations

import math

import pytest
import torch

import megalith_comm as comm
from megalith.booster import Booster
from megalith.booster.booster import _add_lora_params
from megalith.nn.lr_scheduler import CosineAnnealingWarmupLR
from megalith.testing import run_distributed
from tests.colossalai import lora_workers as lw
from tests.colossalai.dp_workers import make_plugin


def _adam(lr: float = 1e-3) -> torch.optim.Optimizer:
    return torch.optim.Adam(torch.nn.Linear(3, 3).parameters(), lr=lr)


def test_cosine_without_warmup_built_again_keeps_the_stepped_lr():
    opt = _adam()
    first = CosineAnnealingWarmupLR(opt, total_steps=10)
    opt.step()
    first.step()
    stepped = opt.param_groups[0]["lr"]
    assert stepped == pytest.approx(1e-3 * (1 + math.cos(math.pi / 10)) / 2)
    CosineAnnealingWarmupLR(opt, total_steps=10)
    assert opt.param_groups[0]["lr"] == stepped


def test_cosine_schedules_are_unchanged_from_a_fresh_optimizer():
    opt, ref_opt = _adam(), _adam()
    ours = CosineAnnealingWarmupLR(opt, total_steps=6, eta_min=1e-5)
    ref = torch.optim.lr_scheduler.CosineAnnealingLR(ref_opt, T_max=6, eta_min=1e-5)
    for _ in range(6):
        assert opt.param_groups[0]["lr"] == pytest.approx(ref_opt.param_groups[0]["lr"])
        opt.step(), ref_opt.step(), ours.step(), ref.step()
    warm = _adam(2e-3)
    CosineAnnealingWarmupLR(warm, total_steps=6, warmup_steps=2)
    assert warm.param_groups[0]["lr"] == pytest.approx(1e-3)  # (0 + 1) / 2 of the base


def _peft_mlp():
    import peft

    torch.manual_seed(0)
    mlp = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Tanh(), torch.nn.Linear(4, 2))
    head = list(mlp[2].parameters())
    opt = torch.optim.Adam(
        [{"params": list(mlp[0].parameters()), "lr": 1e-2}, {"params": head, "lr": 1e-3}]
    )
    config = peft.LoraConfig(r=2, target_modules=["0"], modules_to_save=["2"])
    return peft.get_peft_model(mlp, config), opt


def test_adapters_join_the_param_group_of_the_weight_they_adapt():
    model, opt = _peft_mlp()
    _add_lora_params(model, opt)
    names = {id(p): n for n, p in model.named_parameters()}
    groups = [sorted(names[id(p)] for p in g["params"]) for g in opt.param_groups]
    assert "base_model.model.0.lora_A.default.weight" in groups[0]
    assert "base_model.model.0.lora_B.default.weight" in groups[0]
    assert "base_model.model.2.modules_to_save.default.weight" in groups[1]
    assert "base_model.model.2.modules_to_save.default.bias" in groups[1]
    _add_lora_params(model, opt)  # a second boost adds nothing twice
    assert sum(len(g["params"]) for g in opt.param_groups) == 4 + 4


def test_an_adapter_whose_base_weight_is_not_in_the_optimizer_is_named():
    model, _ = _peft_mlp()
    opt = torch.optim.Adam([torch.nn.Parameter(torch.randn(2))])
    with pytest.warns(UserWarning, match=r"lora_A\.default\.weight.*base_layer\.weight"):
        _add_lora_params(model, opt)
    assert len(opt.param_groups[0]["params"]) == 1


def _lora_with_early_optimizer(rank: int) -> float:
    """ColossalAI's test pattern: the optimizer is built before enable_lora."""
    import peft

    ref = peft.get_peft_model(lw.base_model(), lw.lora_config())
    ref_opt = torch.optim.AdamW([p for p in ref.parameters() if p.requires_grad], lr=1e-2)
    booster = Booster(plugin=make_plugin("zero2"))
    base = lw.base_model()
    opt = torch.optim.AdamW(base.parameters(), lr=1e-2)
    model = booster.enable_lora(base, lora_config=lw.lora_config())
    model, opt, *_ = booster.boost(model, opt)
    n = lw.GLOBAL_BATCH // comm.get_world().world_size
    for ids in lw._batches():
        lw._loss(ref, ids).backward()
        ref_opt.step()
        ref_opt.zero_grad()
        booster.backward(lw._loss(model, ids[rank * n : (rank + 1) * n]), opt)
        opt.step()
        opt.zero_grad()
    got, want = lw._adapter(model.unwrap(unwrap_peft=False)), lw._adapter(ref)
    assert sorted(got) == sorted(want)
    assert max(float(want[k].abs().max()) for k in want if "lora_B" in k) > 1e-3  # trained
    return max(float((got[k] - want[k]).abs().max()) for k in want)


@pytest.mark.timeout(60)
def test_zero2_trains_adapters_of_an_optimizer_built_before_enable_lora():
    # test_lora.py's bound: Adam after 3 steps on sharded fp32 sums (rounding only)
    assert max(run_distributed(_lora_with_early_optimizer, 2, timeout=50)) < 2e-4


def test_colossalai_module_paths_of_lazy_and_booster_accelerator():
    from megalith.booster.accelerator import Accelerator
    from megalith.lazy import LazyInitContext
    from megalith.lazy.lazy_init import LazyInitContext as FromColossalPath

    assert FromColossalPath is LazyInitContext
    model = Accelerator("cpu").configure_model(torch.nn.Linear(2, 2).double())
    assert next(model.parameters()).device.type == "cpu"
    with pytest.raises(ValueError, match=r"xpu.*get_accelerator"):
        Accelerator("xpu")


def test_randomizer_reset_index_repeats_the_dropout_seeds_and_fork_rng_keeps_the_caller():
    # ColossalAI's hybrid checkpoint test calls Randomizer.reset_index() before building
    # the model again (megalith.shardformer.layer.utils was missing)
    from megalith.shardformer.layer import DropoutForReplicatedInput
    from megalith.shardformer.layer.utils import Randomizer

    Randomizer.reset_index()
    first = [DropoutForReplicatedInput(0.5).seed for _ in range(3)]
    assert Randomizer.index() == 3
    Randomizer.reset_index()
    assert [DropoutForReplicatedInput(0.5).seed for _ in range(3)] == first
    assert len(set(first)) == 3 and Randomizer.is_randomizer_index_synchronized()
    torch.manual_seed(5)
    want = torch.rand(4)
    torch.manual_seed(5)
    a, b = Randomizer(11), Randomizer(11)
    with a.fork_rng(enable_cpu=True):
        x = torch.rand(4)
    assert torch.equal(torch.rand(4), want)  # the caller's stream as if nothing ran
    with b.fork_rng(enable_cpu=True):
        assert torch.equal(torch.rand(4), x)
    with a.fork_rng(enable_cpu=True):
        assert not torch.equal(torch.rand(4), x)  # a's stream went on
