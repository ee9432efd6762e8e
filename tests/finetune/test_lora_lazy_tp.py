"""peft LoRA on a model built in LazyInitContext under HybridParallelPlugin(tp_size=2)
(issue 19), on 2 CPU ranks: the base is materialised straight into its tp shards (each
full weight real only while its shard is cut, megalith.lazy.tp_shards: the replaced
full Parameters stay on the meta device and nothing materialises the whole model), the
adapters split as tensor_parallel/lora.py splits them; transformers' Llama (grouped kv
heads) with adapters added by enable_lora, GPT-2 (fused q|k|v, tied embeddings) with
adapters added by peft inside the context. Against eager peft from the same seed (lora_lazy_checks):
losses of three SGD steps and first-step adapter gradients (1e-5 relative), the trained
adapters, the frozen base bit-equal, and the saved adapter loaded by peft."""

from __future__ import annotations

import pytest
import torch

from megalith.testing import run_grid

pytest.importorskip("peft")
pytest.importorskip("transformers")

GRID = [("llama", "enable_lora"), ("gpt2", "inside")]


@pytest.mark.timeout(90)
def test_lora_on_a_lazy_model_under_tp2_is_eager_peft(tmp_path, gen):
    from tests.finetune import lora_lazy_workers as w
    from tests.finetune.lora_lazy_checks import check_lazy_lora

    seed = int(torch.randint(0, 2**31, (1,), generator=gen))
    settings = [
        ("hybrid-tp2", family, how, seed, None, str(tmp_path / f"adapter-{i}"))
        for i, (family, how) in enumerate(GRID)
    ]
    results = run_grid(w.lazy_lora, settings, 2, timeout=80)
    check_lazy_lora(settings, results)
    for per_rank in results:
        for r in per_rank:
            assert r["n_replaced"] > 0 and r["full_made_real"] == [], r["full_made_real"]


def test_a_lazy_tensor_read_while_sharding_has_eager_values_and_stays_lazy(gen):
    """One process: under shard_lazily's mode every read of a lazy weight (through .data,
    .T, a slice, a cat) sees eager construction's values, the Parameter stays on the meta
    device, and a write to it is refused with the fix."""
    from megalith.lazy import LazyInitContext
    from megalith.lazy.tp_shards import _RealOnRead

    seed = int(torch.randint(0, 2**31, (1,), generator=gen))
    torch.manual_seed(seed)
    eager = torch.nn.Linear(4, 6)
    torch.manual_seed(seed)
    with LazyInitContext():
        lazy = torch.nn.Linear(4, 6)
    with _RealOnRead():
        rows = lazy.weight.data[2:4].clone()
        transposed = lazy.weight.T.contiguous()
        joined = torch.cat([lazy.weight.detach()[:1], lazy.bias[None, :4]])
        with pytest.raises(ValueError, match=r"LazyInitContext\.materialize"):
            lazy.weight.data.mul_(2)
        with pytest.raises(ValueError, match=r"LazyInitContext\.materialize"):
            lazy.weight.data[0] = 1.0
    assert torch.equal(rows, eager.weight[2:4]) and torch.equal(transposed, eager.weight.T)
    assert torch.equal(joined, torch.cat([eager.weight.detach()[:1], eager.bias[None, :4]]))
    assert lazy.weight.is_meta and lazy.bias.is_meta
