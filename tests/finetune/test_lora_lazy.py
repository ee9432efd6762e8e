"""peft LoRA adapters on a model built in LazyInitContext (issue 19, items 2 and 3), on 2
CPU ranks: booster.enable_lora after the context makes the adapters real at once (on
the host, a few parameters) and leaves the base weights lazy; GeminiPlugin (chunks of
2048 elements; with offload) and LowLevelZeroPlugin then materialise the base a chunk
at a time (never the whole model), HybridParallelPlugin at tp 1 whole. The result is
the eager peft model built from the same seed (adapters drawn where eager peft draws
them: after the base weights, or after the caller's reseed), or from the same
checkpoint (booster.load_model before boost, either side of enable_lora): losses of
three SGD steps (1e-5 relative), the first step's adapter gradients (1e-5 relative,
read back from the step beyond its fp32 rounding), the trained adapters, base weights bit-equal and frozen, and an
adapter saved with save_lora_as_pretrained that peft loads into the eager base with
the eager peft model's logits. peft.get_peft_model inside the context works too
(adapters recorded and replayed per chunk); after it, boost refuses the model, whose
adapters peft moved to the meta device. On one process: the adapters and the generators
after enable_lora are eager peft's, bit for bit; a saved adapter (pretrained_dir) loads
onto a lazy model."""

from __future__ import annotations

import pytest
import torch

from megalith.testing import run_grid

pytest.importorskip("peft")
pytest.importorskip("transformers")

GRID = [
    ("zero2", "gpt2", "enable_lora"),
    ("gemini-chunks", "llama", "enable_lora"),
    ("gemini-offload", "llama", "reseeded"),
    ("hybrid-tp1", "llama", "enable_lora"),
    ("gemini-chunks", "gpt2", "inside"),
    ("zero2", "llama", "load_first"),
    ("gemini-chunks", "llama", "lora_first"),
    ("gemini-chunks", "llama", "peft_after_context"),
]


@pytest.mark.timeout(150)
def test_lora_on_a_lazily_built_model_is_eager_peft(tmp_path, gen):
    from tests.finetune import lora_lazy_workers as w
    from tests.finetune.lora_lazy_checks import check_lazy_lora
    from tests.finetune.workers import write_checkpoint

    seed = int(torch.randint(0, 2**31, (1,), generator=gen))
    checkpoint = tmp_path / "llama"
    write_checkpoint(checkpoint, "llama", 3, torch.float32, seed + 2)
    settings = [
        (plugin, family, how, seed, str(checkpoint) if how.endswith("_first") else None,
         str(tmp_path / f"adapter-{i}"))
        for i, (plugin, family, how) in enumerate(GRID)
    ]  # fmt: skip
    check_lazy_lora(settings, run_grid(w.lazy_lora, settings, 2, timeout=130))


@pytest.mark.parametrize("reseed", [False, True])
def test_adapters_are_eager_peft_s_and_the_generators_end_where_eager_ones_do(reseed, gen):
    """One process: enable_lora's adapters on a lazy model hold eager peft's values (bit
    for bit), on the host, beside base weights still on the meta device."""
    import peft

    from megalith.booster.plugin.base import peft_model
    from megalith.lazy import LazyInitContext
    from tests.finetune.lora_hybrid_workers import lora_config
    from tests.finetune.workers import build

    seed = int(torch.randint(0, 2**31, (1,), generator=gen))
    runs = []
    for lazy in (False, True):
        torch.manual_seed(seed)
        if lazy:
            with LazyInitContext():
                base = build("llama")
        else:
            base = build("llama")
        if reseed:
            torch.manual_seed(seed + 1)
        model = (
            peft_model("Test", base, None, lora_config("llama"), None)
            if lazy
            else peft.get_peft_model(base, lora_config("llama"))
        )
        runs.append((peft.get_peft_model_state_dict(model), torch.random.get_rng_state()))
        if lazy:
            frozen = [p for n, p in model.named_parameters() if "lora_" not in n]
            assert frozen and all(p.is_meta for p in frozen)
    (eager, eager_rng), (lazy, lazy_rng) = runs
    assert eager.keys() == lazy.keys()
    assert all(v.device.type == "cpu" and torch.equal(v, eager[k]) for k, v in lazy.items())
    assert torch.equal(eager_rng, lazy_rng)


def test_a_saved_adapter_loads_onto_a_lazy_model(tmp_path, gen):
    """enable_lora(pretrained_dir=...) on a lazy model: the saved adapter's values, real,
    beside base weights still on the meta device (peft would leave meta copies)."""
    import peft

    from megalith.booster.plugin.base import peft_model
    from megalith.lazy import LazyInitContext
    from tests.finetune.lora_hybrid_workers import lora_config
    from tests.finetune.workers import build

    torch.manual_seed(int(torch.randint(0, 2**31, (1,), generator=gen)))
    saved = peft.get_peft_model(build("gpt2"), lora_config("gpt2"))
    saved.save_pretrained(str(tmp_path))
    with LazyInitContext():
        base = build("gpt2")
    model = peft_model("Test", base, str(tmp_path), None, None)
    want, got = peft.get_peft_model_state_dict(saved), peft.get_peft_model_state_dict(model)
    assert want.keys() == got.keys() and all(torch.equal(got[k], want[k]) for k in want)
    trainable = [p for p in model.parameters() if p.requires_grad]
    assert trainable and all(not p.is_meta for p in trainable)
    assert all(p.is_meta for n, p in model.named_parameters() if "lora_" not in n)
