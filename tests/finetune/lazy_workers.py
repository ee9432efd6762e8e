"""What each rank runs in test_lazy_plugins.py: a model built in LazyInitContext and one
built eagerly under the same seed, each boosted and trained two steps; every loss and
the final logits must be the same bits."""

from __future__ import annotations

from typing import Any

import torch

from tests.finetune.workers import make_plugin

V = 64


def builders() -> dict[str, Any]:
    """Tiny transformers models without dropout (GPT-2 tied, Llama GQA, BERT, T5)."""
    import transformers as t

    from tests.finetune.workers import config

    bert = t.BertConfig(
        vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=2, max_position_embeddings=32, hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )  # fmt: skip
    t5 = t.T5Config(
        vocab_size=V, d_model=32, d_kv=16, d_ff=64, num_layers=2, num_decoder_layers=2,
        num_heads=2, dropout_rate=0.0, decoder_start_token_id=0, pad_token_id=0,
    )  # fmt: skip
    return {
        "gpt2": lambda: t.GPT2LMHeadModel(config("gpt2")),
        "llama": lambda: t.LlamaForCausalLM(config("llama")),
        "bert": lambda: t.BertForMaskedLM(bert),
        "t5": lambda: t5_model(t5),
    }


def t5_model(config: Any) -> torch.nn.Module:
    import transformers

    return transformers.T5ForConditionalGeneration(config)


def batch(family: str) -> dict[str, torch.Tensor]:
    ids = torch.randint(1, V, (2, 8), generator=torch.Generator().manual_seed(7))
    if family == "t5":
        return {"input_ids": ids, "labels": ids.flip(1)}
    return {"input_ids": ids, "labels": ids}


def lazy_equals_eager(rank: int, setting: tuple[str, str, int]) -> dict[str, Any]:
    from megalith.booster import Booster
    from megalith.lazy import LazyInitContext

    plugin_name, family, seed = setting
    torch.set_num_threads(1)
    build, inputs = builders()[family], batch(family)
    runs = {}
    for lazy in (False, True):
        torch.manual_seed(seed)
        if lazy:
            with LazyInitContext():
                model = build()
        else:
            model = build()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        booster = Booster(plugin=make_plugin(plugin_name))
        model, opt, *_ = booster.boost(model, opt)  # materialises the lazy one
        losses = []
        for _ in range(2):
            loss = model(**inputs).loss
            booster.backward(loss, opt)
            opt.step()
            opt.zero_grad()
            losses.append(loss.detach().clone())
        with torch.no_grad():
            losses.append(model(**inputs).logits.float().sum())
        runs[lazy] = torch.stack(losses)
    return {"equal": bool(torch.equal(runs[True], runs[False])), "eager": runs[False].tolist()}
