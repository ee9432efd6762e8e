"""Reference models: presets, parameter and FLOP formulas, shapes, loss, errors."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

from megalith import models
from megalith.models import GPTConfig, LlamaConfig

TINY = ("gpt-tiny", "llama-tiny")


def tiny(name: str, **overrides) -> models.CausalLM:
    return models.create(name, device="cpu", seed=1, vocab_size=128, **overrides)


@pytest.mark.parametrize("name", models.list_models())
def test_every_preset_builds_on_meta_with_the_formula_count(name):
    model = models.create(name)
    params = list(model.parameters())  # a tied weight is listed once
    assert all(p.is_meta for p in params)
    assert sum(p.numel() for p in params) == models.num_parameters(model)


@pytest.mark.parametrize(
    ("name", "count"),
    [
        # The published sizes of the models these presets copy.
        ("gpt2-124m", 124_439_808),
        ("gpt2-1.5b", 1_557_611_200),
        ("llama-1b", 1_235_814_400),
        ("llama-7b", 6_738_415_616),
        ("llama3-8b", 8_030_261_248),
        ("llama-13b", 13_015_864_320),
        ("llama-70b", 68_976_648_192),
    ],
)
def test_published_parameter_counts(name, count):
    assert models.num_parameters(models.get_config(name)) == count


@pytest.mark.parametrize(
    ("name", "d", "layers", "heads"), [("gpt-1.3b", 2048, 24, 16), ("gpt-6.7b", 4096, 32, 32)]
)
def test_anchor_gpts_and_their_flops(name, d, layers, heads):
    """The shapes and the FLOP formula of ../shared/ANCHORS.md's plain-torch runs (vocab 50304, seq 2048)."""
    config = models.get_config(name)
    assert (config.d_model, config.n_layers, config.n_heads, config.max_seq_len) == (
        d,
        layers,
        heads,
        2048,
    )
    assert config.vocab_size == 50304 and config.tie_word_embeddings
    per_layer = 12 * d * d + 13 * d
    n = layers * per_layer + 50304 * d + 2 * d  # tied wte/head + ln_f; position table left out
    assert models.num_parameters(config) == n + 2048 * d
    assert models.num_flop_parameters(config) == n
    assert models.flops_per_token(config) == 6 * n + 12 * layers * d * 2048
    assert models.flops_per_token(config, seq_len=1024) == 6 * n + 12 * layers * d * 1024
    # 58,651 tok/s on one H200 is 53.8% of 989 TFLOP/s in ANCHORS.md.
    if name == "gpt-1.3b":
        assert models.mfu(58_651, config, 989e12) == pytest.approx(0.538, abs=0.001)


def test_untied_llama_counts_the_head_but_not_the_lookup():
    config = models.get_config("llama-7b")
    table = config.vocab_size * config.d_model
    assert models.num_flop_parameters(config) == models.num_parameters(config) - table
    tied = models.get_config("llama-1b")
    assert models.num_flop_parameters(tied) == models.num_parameters(tied)


@pytest.mark.parametrize("name", TINY)
def test_logits_shape_and_shifted_loss(name):
    model = tiny(name)
    ids = torch.randint(0, 128, (3, 17), generator=torch.Generator().manual_seed(0))
    logits = model(ids)
    assert logits.shape == (3, 17, 128) and logits.dtype == torch.float32
    out = model(ids, labels=ids)
    assert torch.equal(out.logits, logits) and out[0] is out.loss
    expected = F.cross_entropy(logits[:, :-1].reshape(-1, 128), ids[:, 1:].reshape(-1))
    torch.testing.assert_close(out.loss, expected)  # same terms, summed in another order
    loss, _ = model(ids, labels=ids)  # unpacks like a tuple
    assert loss.item() == out.loss.item()


def test_ignored_labels_do_not_count():
    logits = torch.randn(2, 5, 11)
    labels = torch.randint(0, 11, (2, 5))
    labels[0, 3] = models.IGNORE_INDEX
    keep = torch.ones(2, 4, dtype=torch.bool)
    keep[0, 2] = False  # label position 3 is predicted from logits position 2
    expected = F.cross_entropy(logits[:, :-1][keep], labels[:, 1:][keep])
    torch.testing.assert_close(models.causal_lm_loss(logits, labels), expected)
    with pytest.raises(ValueError, match="labels must have the shape"):
        models.causal_lm_loss(logits, labels[:, :4])


@pytest.mark.parametrize("name", TINY)
def test_pipeline_parts_compose_to_forward(name):
    model = tiny(name)
    embedding, blocks, head = model.pipeline_parts()
    assert len(blocks) == model.config.n_layers
    ids = torch.randint(0, 128, (2, 9))
    hidden = embedding(ids)
    assert hidden.shape == (2, 9, model.config.d_model)
    for block in blocks:
        hidden = block(hidden)
        assert hidden.shape == (2, 9, model.config.d_model)
    assert torch.equal(head(hidden), model(ids))
    # The parts hold the model's own parameters, not copies.
    model_params = {id(p) for p in model.parameters()}
    for part in (embedding, *blocks, head):
        assert all(id(p) in model_params for p in part.parameters())


def test_gpt_tied_head_and_hf_names():
    model = models.create("gpt-tiny")
    assert model.lm_head.weight is model.transformer.wte.weight
    assert model.tied_weights == {"lm_head.weight": "transformer.wte.weight"}
    names = set(model.state_dict())
    for suffix in ("ln_1.weight", "attn.c_attn.weight", "attn.c_attn.bias", "attn.c_proj.weight",
                   "ln_2.bias", "mlp.c_fc.weight", "mlp.c_proj.bias"):  # fmt: skip
        assert f"transformer.h.3.{suffix}" in names
    assert {
        "transformer.wte.weight",
        "transformer.wpe.weight",
        "transformer.ln_f.weight",
        "lm_head.weight",
    } <= names
    d = model.config.d_model
    assert model.transformer.h[0].attn.c_attn.weight.shape == (d, 3 * d)  # [in, out], as Conv1D
    assert model.transformer.h[0].mlp.c_proj.weight.shape == (4 * d, d)


def test_llama_hf_names_and_gqa_shapes():
    model = models.create("llama-tiny")
    config = model.config
    assert config.num_kv_heads == 2 and config.n_heads == 4
    layer = model.model.layers[1]
    kv = config.num_kv_heads * config.head_dim
    assert layer.self_attn.k_proj.weight.shape == (kv, config.d_model)
    assert layer.self_attn.q_proj.weight.shape == (config.d_model, config.d_model)
    assert layer.mlp.gate_proj.weight.shape == (config.d_ff, config.d_model)
    names = set(model.state_dict())
    assert {"model.embed_tokens.weight", "model.norm.weight", "lm_head.weight",
            "model.layers.1.input_layernorm.weight", "model.layers.1.post_attention_layernorm.weight",
            "model.layers.1.self_attn.o_proj.weight", "model.layers.1.mlp.down_proj.weight"} <= names  # fmt: skip
    assert not any(name.endswith("bias") for name in names)
    assert model.lm_head.weight is not model.model.embed_tokens.weight


def test_errors_name_the_fix():
    with pytest.raises(ValueError, match=r"unknown model 'gpt-huge'.*gpt-tiny"):
        models.create("gpt-huge")
    with pytest.raises(TypeError, match=r"no field.*'n_layer'"):
        models.create("gpt-tiny", n_layer=3)
    with pytest.raises(ValueError, match=r"d_model \(100\) must be divisible by n_heads \(3\)"):
        GPTConfig(d_model=100, n_heads=3)
    with pytest.raises(ValueError, match=r"n_heads \(4\) must be a multiple of n_kv_heads \(3\)"):
        LlamaConfig(d_model=64, n_heads=4, n_kv_heads=3)
    with pytest.raises(ValueError, match="positive int"):
        GPTConfig(n_layers=0)
    model = tiny("gpt-tiny", max_seq_len=8)
    with pytest.raises(ValueError, match="over this GPT's max_seq_len"):
        model(torch.zeros(1, 9, dtype=torch.long))


def test_config_round_trips():
    for name in models.list_models():
        config = models.get_config(name)
        assert models.config_from_dict(config.to_dict()) == config
        assert models.from_hf_config(config.to_hf_config(), name=name) == config


def test_parts_follow_swapped_modules_and_deepcopy():
    """A module replaced after creation (as tensor parallelism does) is the one that runs."""
    model = tiny("llama-tiny")
    ids = torch.randint(0, 128, (2, 9))
    before = model(ids)
    clone = copy.deepcopy(model)
    assert torch.equal(clone(ids), before)
    model.lm_head = torch.nn.Linear(model.config.d_model, 7, bias=False)
    assert model(ids).shape == (2, 9, 7)
    assert model.pipeline_parts()[2](model.embed(ids)).shape == (2, 9, 7)
