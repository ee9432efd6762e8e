"""megalith.lazy: ColossalAI's LazyInitContext. A model built inside it allocates no
parameter memory; LazyInitContext.materialize gives, in place, the values eager
construction gives under the same seed (torch.nn's layers, transformers' GPT-2, Llama
and BERT); a materialised model boosts and trains like the eager one on 2 ranks."""

from __future__ import annotations

import os

import pytest
import torch

from megalith.lazy import LazyInitContext, LazyTensor, is_lazy
from megalith.testing import run_distributed
from tests.colossalai.ckpt_workers import lazy_boost_matches_eager, tiny_models


def torch_layers() -> torch.nn.Module:
    return torch.nn.ModuleDict(
        {
            "linear": torch.nn.Linear(6, 5),
            "conv": torch.nn.Conv2d(3, 4, 3),
            "bn": torch.nn.BatchNorm2d(4),
            "emb": torch.nn.Embedding(10, 3, padding_idx=0),
            "ln": torch.nn.LayerNorm(5),
            "gru": torch.nn.GRU(4, 6),
            "lstm": torch.nn.LSTM(4, 6, num_layers=2),
            "mha": torch.nn.MultiheadAttention(8, 2),
            "encoder": torch.nn.TransformerEncoderLayer(8, 2, 16),
            "convt": torch.nn.ConvTranspose1d(3, 2, 2),
            "bilinear": torch.nn.Bilinear(3, 4, 2),
        }
    )


def eager_and_lazy(build, seed: int):
    torch.manual_seed(seed)
    eager = build()
    torch.manual_seed(seed)
    with LazyInitContext():
        lazy = build()
    return eager, lazy


def assert_same(eager: torch.nn.Module, lazy: torch.nn.Module) -> None:
    a, b = eager.state_dict(), lazy.state_dict()
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k
    for (n, x), (_, y) in zip(eager.named_buffers(), lazy.named_buffers()):
        assert torch.equal(x, y), n  # non-persistent ones too (Llama's inv_freq)


MODELS = {"torch": torch_layers, **tiny_models()}


@pytest.mark.parametrize("name", list(MODELS))
def test_materialised_values_are_eager_constructions(name, gen):
    seed = int(torch.randint(0, 2**31, (1,), generator=gen))
    eager, lazy = eager_and_lazy(MODELS[name], seed)
    assert is_lazy(lazy) and not is_lazy(eager)
    assert all(p.is_meta for p in lazy.parameters())
    # torch.tensor(data) stays real (code may branch on it): BatchNorm's step counter
    assert all(b.is_meta or b.numel() == 1 for b in lazy.buffers())
    params = list(lazy.parameters())
    assert LazyInitContext.materialize(lazy) is lazy
    assert not is_lazy(lazy)
    rnn = {id(p) for m in lazy.modules() if isinstance(m, torch.nn.RNNBase) for p in m.parameters()}
    kept = [a is b for a, b in zip(params, lazy.parameters()) if id(b) not in rnn]
    assert all(kept), "materialised in place (but for RNNs: they hold weak references)"
    assert [p.requires_grad for p in eager.parameters()] == [p.requires_grad for p in params]
    assert_same(eager, lazy)
    if name == "gpt2":  # transformers' tie survives
        assert lazy.lm_head.weight is lazy.transformer.wte.weight
    if name == "torch":  # the RNNs run on their new weights
        x = torch.randn(5, 2, 4, generator=gen)
        for rnn_name in ("gru", "lstm"):
            assert torch.equal(eager[rnn_name](x)[0], lazy[rnn_name](x)[0])


def test_an_optimizer_built_on_the_lazy_model_steps_the_real_one(gen):
    seed = int(torch.randint(0, 2**31, (1,), generator=gen))
    eager, lazy = eager_and_lazy(MODELS["llama"], seed)
    opts = [torch.optim.AdamW(m.parameters(), lr=1e-2) for m in (eager, lazy)]
    LazyInitContext.materialize(lazy)
    ids = torch.randint(0, 64, (2, 8), generator=gen)
    for m, opt in zip((eager, lazy), opts):
        m(input_ids=ids, labels=ids).loss.backward()
        opt.step()
    assert_same(eager, lazy)


def test_materialize_leaves_the_random_stream_alone(gen):
    with LazyInitContext():
        lazy = torch.nn.Linear(8, 8)
    torch.manual_seed(5)
    LazyInitContext.materialize(lazy)
    after = torch.rand(3)
    torch.manual_seed(5)
    assert torch.equal(after, torch.rand(3))


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_a_billion_parameters_allocate_nothing():
    """16 Linear(8192, 8192): 1.07e9 parameters, 4 GiB in fp32 eagerly. Built lazily,
    the process's resident memory grows by what the record itself takes."""
    before = _rss()
    with LazyInitContext():
        big = torch.nn.Sequential(*[torch.nn.Linear(8192, 8192) for _ in range(16)])
    grown = _rss() - before
    numel = sum(p.numel() for p in big.parameters())
    assert numel > 1.07e9
    assert all(p.is_meta for p in big.parameters())
    print(f"lazy build of {numel / 1e9:.2f}e9 params (eager: {numel * 4 / 2**30:.1f} GiB): "
          f"resident memory grew {grown / 2**20:.1f} MiB")  # fmt: skip
    assert grown < 32 << 20, grown


def test_default_device_and_refusals():
    with LazyInitContext(default_device="cpu"):
        m = torch.nn.Linear(3, 2)
    assert m.weight.is_meta
    LazyInitContext.materialize(m, verbose=True)
    assert m.weight.device.type == "cpu" and m.bias.device.type == "cpu"
    with pytest.raises(NotImplementedError, match="materialize"):
        LazyInitContext.distribute(m, None, {})
    with pytest.raises(NotImplementedError, match="LazyInitContext"):
        LazyTensor()
    with pytest.raises(ValueError, match="tensor_cls"):
        LazyInitContext(tensor_cls=torch.Tensor)


def test_a_materialised_model_boosts_and_trains_like_the_eager_one(gen):
    """2 CPU ranks: a GPT-2 built lazily and materialised, boosted with LowLevelZeroPlugin
    (and TorchDDPPlugin), takes exactly the eagerly built one's steps, and a plain
    single-process run's within summation order."""
    seed = int(torch.randint(0, 2**31, (1,), generator=gen))
    errors = run_distributed(lazy_boost_matches_eager, 2, seed, timeout=120)
    assert errors == [[], []], errors
