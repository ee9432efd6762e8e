"""LazyInitContext (issue 19, item 2): transformers' tiny GPT-2, Llama, BERT and T5
built lazily equal eager construction under the same seed, alone and boosted under
TorchDDP, LowLevelZero stage 2, Gemini and HybridParallel tp 2 (2 CPU ranks: the
lazily built model's losses and logits are the eager one's, bit for bit)."""

from __future__ import annotations

import pytest
import torch

from megalith.lazy import LazyInitContext
from megalith.testing import run_grid

pytest.importorskip("transformers")

FAMILIES = ["gpt2", "llama", "bert", "t5"]
PLUGINS = ["ddp", "zero2", "gemini", "tp2"]


def test_t5_materialises_to_eager_construction(gen):
    """T5 (the other three are in tests/colossalai/test_lazy_init.py)."""
    from tests.finetune.lazy_workers import builders

    seed = int(torch.randint(0, 2**31, (1,), generator=gen))
    build = builders()["t5"]
    torch.manual_seed(seed)
    eager = build()
    torch.manual_seed(seed)
    with LazyInitContext():
        lazy = build()
    assert all(p.is_meta for p in lazy.parameters())
    LazyInitContext.materialize(lazy)
    a, b = eager.state_dict(), lazy.state_dict()
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)
    tied = lazy.lm_head.weight is lazy.shared.weight
    assert tied == (eager.lm_head.weight is eager.shared.weight)


@pytest.mark.timeout(240)
def test_lazy_models_boost_and_train_as_eager_ones_under_every_plugin(gen):
    from tests.finetune.lazy_workers import lazy_equals_eager

    seed = int(torch.randint(0, 2**31, (1,), generator=gen))
    settings = [(p, f, seed) for p in PLUGINS for f in FAMILIES]
    results = run_grid(lazy_equals_eager, settings, 2, timeout=200)
    bad = [(s, r) for s, per_rank in zip(settings, results) for r in per_rank if not r["equal"]]
    assert not bad, bad
    for per_rank in results:  # real values: losses of a model that is training
        losses = per_rank[0]["eager"][:2]
        assert all(x == x and x > 0 for x in losses) and losses[1] < losses[0], per_rank
