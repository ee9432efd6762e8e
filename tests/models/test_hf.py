"""Reference models against transformers: same logits with our weights in
GPT2LMHeadModel / LlamaForCausalLM, and safetensors directories that
from_pretrained loads (and that load_pretrained reads back).
"""

from __future__ import annotations

import json

import pytest
import torch

from megalith import models

transformers = pytest.importorskip("transformers")

ATOL = 1e-5  # fp32
# llama-tiny has 2 kv heads for 4 query heads, so grouped-query attention is covered.
CASES = [
    ("gpt-tiny", {}),
    ("gpt-tiny", {"tie_word_embeddings": False, "d_ff": 200}),
    ("llama-tiny", {}),
    ("llama-tiny", {"tie_word_embeddings": True, "n_kv_heads": 1, "rope_theta": 500000.0}),
]


def ours(name: str, **overrides) -> models.CausalLM:
    model = models.create(name, device="cpu", seed=4, vocab_size=96, **overrides)
    return model.eval()


def theirs(model: models.CausalLM) -> torch.nn.Module:
    config = transformers.AutoConfig.for_model(**model.to_hf_config())
    hf = transformers.AutoModelForCausalLM.from_config(config, torch_dtype=torch.float32)
    return hf.eval()


def sample_ids(vocab: int = 96) -> torch.Tensor:
    return torch.randint(0, vocab, (2, 40), generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize(("name", "overrides"), CASES)
def test_same_logits_and_loss_with_our_weights(name, overrides):
    model = ours(name, **overrides)
    hf = theirs(model)
    expected_class = "GPT2LMHeadModel" if name.startswith("gpt") else "LlamaForCausalLM"
    assert type(hf).__name__ == expected_class
    hf.load_state_dict(model.state_dict(), strict=True)
    ids = sample_ids()
    with torch.no_grad():
        mine, hf_out = model(ids, labels=ids), hf(input_ids=ids, labels=ids)
    torch.testing.assert_close(mine.logits, hf_out.logits, rtol=0, atol=ATOL)
    torch.testing.assert_close(mine.loss, hf_out.loss, rtol=1e-6, atol=ATOL)


@pytest.mark.parametrize(("name", "overrides"), CASES[::2])
def test_their_weights_load_into_ours(name, overrides):
    model = ours(name, **overrides)
    hf = theirs(model)  # initialised by transformers
    model.load_state_dict(hf.state_dict(), strict=True)
    ids = sample_ids()
    with torch.no_grad():
        torch.testing.assert_close(model(ids), hf(input_ids=ids).logits, rtol=0, atol=ATOL)


@pytest.mark.parametrize("shard_bytes", [None, 60_000])
@pytest.mark.parametrize(("name", "overrides"), CASES)
def test_save_then_from_pretrained(tmp_path, name, overrides, shard_bytes):
    model = ours(name, **overrides)
    models.save_pretrained(model, tmp_path, max_shard_bytes=shard_bytes)
    index = tmp_path / "model.safetensors.index.json"
    if shard_bytes is None:
        assert (tmp_path / "model.safetensors").is_file() and not index.exists()
    else:
        files = set(json.loads(index.read_text())["weight_map"].values())
        assert len(files) > 1 and all((tmp_path / f).is_file() for f in files)

    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert next(hf.parameters()).dtype == torch.float32
    ids = sample_ids()
    with torch.no_grad():
        logits = model(ids)
        torch.testing.assert_close(hf(input_ids=ids).logits, logits, rtol=0, atol=ATOL)
        back = models.load_pretrained(tmp_path).eval()
        assert back.config.replace(name=model.config.name) == model.config
        assert torch.equal(back(ids), logits)
    if model.config.tie_word_embeddings:
        assert back.lm_head.weight is back.get_parameter(back.tied_weights["lm_head.weight"])


def test_bf16_directory_keeps_its_dtype(tmp_path):
    model = models.create("llama-tiny", device="cpu", seed=4, vocab_size=96, dtype=torch.bfloat16)
    models.save_pretrained(model, tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["torch_dtype"] == "bfloat16"
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, torch_dtype=torch.bfloat16)
    for name, tensor in hf.state_dict().items():
        assert torch.equal(tensor, model.state_dict()[name]), name
