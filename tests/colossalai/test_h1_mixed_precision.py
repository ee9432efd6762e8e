"""megalith.booster.mixed_precision: ColossalAI's mixed-precision objects, compared step for
step with torch.autocast and torch.amp.GradScaler on CPU."""

from __future__ import annotations

import copy
import itertools

import pytest
import torch

from megalith.booster.mixed_precision import (
    BF16MixedPrecision,
    FP8MixedPrecision,
    FP16ApexMixedPrecision,
    FP16NaiveMixedPrecision,
    FP16TorchMixedPrecision,
    MixedPrecision,
    TorchAMPOptimizer,
    mixed_precision_factory,
)
from megalith.interface import ModelWrapper, OptimizerWrapper


def _model(gen: torch.Generator) -> torch.nn.Module:
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4))
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.3)
    return model


def _batches(gen: torch.Generator, n: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(torch.randn(6, 8, generator=gen), torch.randn(6, 4, generator=gen)) for _ in range(n)]


@pytest.mark.parametrize("clip", [None, 0.5])
def test_fp16_torch_matches_autocast_and_gradscaler(gen, clip):
    # A start far above fp16's range makes the first steps overflow (skipped, scale halved)
    # and a short growth interval makes it grow again: every rule of the scale is exercised.
    kwargs = dict(init_scale=2.0**18, growth_factor=2.0, backoff_factor=0.5, growth_interval=3)
    ref = _model(gen)
    mine = copy.deepcopy(ref)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
    scaler = torch.amp.GradScaler("cpu", **kwargs)
    mp = FP16TorchMixedPrecision(**kwargs)
    model, opt, criterion = mp.configure(
        mine, torch.optim.SGD(mine.parameters(), lr=0.1, momentum=0.9), torch.nn.MSELoss()
    )
    assert isinstance(model, ModelWrapper) and isinstance(opt, OptimizerWrapper)
    scales, skipped = [], 0
    for x, y in _batches(gen, 20):
        with torch.autocast("cpu", dtype=torch.float16):
            ref_loss = torch.nn.functional.mse_loss(ref(x), y)
        scaler.scale(ref_loss).backward()
        if clip is not None:
            scaler.unscale_(ref_opt)
            ref_norm = torch.nn.utils.clip_grad_norm_(ref.parameters(), clip)
        scaler.step(ref_opt)
        scaler.update()
        ref_opt.zero_grad()

        out = model(x)
        assert out.dtype == torch.float16
        loss = criterion(out, y)
        torch.testing.assert_close(loss, ref_loss, rtol=0, atol=0)
        opt.backward(loss)
        if clip is not None:
            norm = opt.clip_grad_by_norm(clip)
            torch.testing.assert_close(norm, ref_norm, rtol=0, atol=0, equal_nan=True)
        before = [p.clone() for p in mine.parameters()]
        opt.step()
        skipped += all(torch.equal(a, b) for a, b in zip(before, mine.parameters()))
        opt.zero_grad()
        assert opt.loss_scale == scaler.get_scale()
        scales.append(opt.loss_scale)
        for a, b in zip(ref.parameters(), mine.parameters()):
            assert torch.equal(a, b)
    grew = any(b > a for a, b in itertools.pairwise(scales))
    assert skipped >= 1 and grew, scales  # it backed off, and grew


def test_bf16_matches_autocast(gen):
    ref = _model(gen)
    mine = copy.deepcopy(ref)
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-2)
    model, opt, _ = BF16MixedPrecision().configure(
        mine, torch.optim.AdamW(mine.parameters(), lr=1e-2)
    )
    for x, y in _batches(gen, 4):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            ref_loss = torch.nn.functional.mse_loss(ref(x).float(), y)
        ref_loss.backward()
        ref_opt.step()
        ref_opt.zero_grad()
        out = model(x)
        assert out.dtype == torch.bfloat16
        opt.backward(torch.nn.functional.mse_loss(out.float(), y))
        opt.step()
        opt.zero_grad()
        assert opt.loss_scale == 1.0
    for a, b in zip(ref.parameters(), mine.parameters()):
        assert torch.equal(a, b)


def test_naive_hysteresis_backs_off_after_two_overflows(gen):
    mp = FP16NaiveMixedPrecision(initial_scale=2**126, max_scale=2**127, hysteresis=2)
    net = _model(gen)
    model, opt, _ = mp.configure(net, torch.optim.SGD(net.parameters(), lr=0.1))
    scales = []
    for x, y in _batches(gen, 2):
        opt.backward(torch.nn.functional.mse_loss(model(x).float(), y) * 1e6)  # overflows
        opt.step()
        opt.zero_grad()
        scales.append(opt.loss_scale)
    assert scales == [2.0**126, 2.0**125]


def test_precision_and_loss_scale_for_the_booster():
    fp16 = FP16TorchMixedPrecision(init_scale=2**12, growth_interval=100)
    assert fp16.precision == "fp16" and fp16.dtype == torch.float16
    assert (fp16.loss_scale.initial, fp16.loss_scale.growth_interval) == (2.0**12, 100)
    assert fp16.loss_scale.hysteresis == 1 and fp16.loss_scale.max_scale == float("inf")
    assert fp16.torch_amp_kwargs == {
        "init_scale": 2**12,
        "growth_factor": 2.0,
        "backoff_factor": 0.5,
        "growth_interval": 100,
    }
    assert (BF16MixedPrecision().precision, BF16MixedPrecision().loss_scale) == ("bf16", None)
    naive = FP16NaiveMixedPrecision(
        False, 2**10, 2, 0.25, 3, 2**20
    )  # ColossalAI's positional order
    assert naive.precision == "fp16"
    assert (naive.loss_scale.initial, naive.loss_scale.backoff, naive.loss_scale.hysteresis) == (
        2.0**10,
        0.25,
        3,
    )
    assert naive.loss_scale.max_scale == 2.0**20
    apex = FP16ApexMixedPrecision()
    assert apex.precision == "fp16" and apex.loss_scale.max_scale == 2.0**24
    assert FP16ApexMixedPrecision(opt_level="O0").precision == "fp32"
    for name, cls in (
        ("fp16", FP16TorchMixedPrecision),
        ("fp16_apex", FP16ApexMixedPrecision),
        ("fp16_naive", FP16NaiveMixedPrecision),
        ("bf16", BF16MixedPrecision),
    ):
        made = mixed_precision_factory(name)
        assert type(made) is cls and isinstance(made, MixedPrecision)
    model = torch.nn.Linear(2, 2)
    assert MixedPrecision().configure(model) == (model, None, None)  # fp32: nothing to wrap
    assert isinstance(
        TorchAMPOptimizer(torch.optim.SGD(model.parameters(), lr=1)), OptimizerWrapper
    )


@pytest.mark.parametrize(
    "make, error, words",
    [
        (lambda: mixed_precision_factory("fp8"), NotImplementedError, "bf16"),
        (lambda: FP8MixedPrecision(), NotImplementedError, "fp8"),
        (lambda: mixed_precision_factory("int4"), ValueError, "fp16_naive"),
        (lambda: FP16ApexMixedPrecision(opt_level="O2"), NotImplementedError, "LowLevelZeroPlugin"),
        (lambda: FP16ApexMixedPrecision(loss_scale=128.0), NotImplementedError, "init_scale=128"),
        (
            lambda: FP16ApexMixedPrecision(master_weights=True),
            NotImplementedError,
            "master_weights",
        ),
        (lambda: FP16ApexMixedPrecision(num_losses=2), NotImplementedError, "num_losses=1"),
    ],
)
def test_refusals_name_what_to_use(make, error, words):
    with pytest.raises(error) as err:
        make()
    assert words in str(err.value)


def test_logging_only_arguments_warn():
    with pytest.warns(UserWarning, match="verbosity=0"):
        FP16ApexMixedPrecision(verbosity=0)
    with pytest.warns(UserWarning, match="log_num_zeros_in_grad"):
        FP16NaiveMixedPrecision(log_num_zeros_in_grad=True)
