"""analyze(): FLOPs and parameters from the meta-device trace equal the closed forms of
each layout (derived here per layout, the trace knows none of them); saved activations
equal what a real CPU forward saves; a 70B model analyses in seconds."""

from __future__ import annotations

import os
import time

import pytest
import torch

from megalith import models
from megalith.autoparallel import analyze
from megalith.models.counting import block_parameters

os.environ.setdefault("HF_HUB_OFFLINE", "1")
SEQ = 48


def all_parts(a):
    return (a.pre, *a.blocks, a.post)


def total(a, field: str) -> int:
    return sum(getattr(b, field) for b in all_parts(a))


def decoder_matmul_weights(config) -> int:
    """Weights of one block's linears: what every token multiplies by."""
    d, ff = config.d_model, config.d_ff
    if isinstance(config, models.GPTConfig):
        return 4 * d * d + 2 * d * ff  # c_attn 3d^2, c_proj d^2, c_fc, mlp c_proj
    kv = config.num_kv_heads * config.head_dim
    return 2 * d * d + 2 * d * kv + 3 * d * ff  # q, o; k, v; gate, up, down


@pytest.mark.parametrize(
    "name, overrides",
    [
        ("gpt-tiny", {}),
        ("gpt-tiny", {"tie_word_embeddings": False, "d_ff": 200}),
        ("llama-tiny", {}),
        ("llama-tiny", {"n_kv_heads": 1, "tie_word_embeddings": True}),
        ("gpt-1.3b", {}),
        ("llama-7b", {}),
    ],
)
def test_megalith_presets_flops_and_params(name, overrides):
    config = models.get_config(name, **overrides)
    seq = 2048 if config.d_model >= 2048 else SEQ
    a = analyze(models.create(config), seq)
    d, layers, vocab = config.d_model, config.n_layers, config.vocab_size
    assert a.family == ("gpt2" if isinstance(config, models.GPTConfig) else "llama")
    assert (a.layers, a.hidden, a.vocab, a.heads) == (layers, d, vocab, config.n_heads)
    assert a.kv_heads == getattr(config, "num_kv_heads", config.n_heads)
    assert a.params == models.num_parameters(config)
    assert len(a.blocks) == layers
    for block in a.blocks:
        assert block.params == block_parameters(config)
        assert block.matmul_flops == 2 * seq * decoder_matmul_weights(config)
        # scores and weighted sum: 2 * heads * s^2 * (head_dim + head_dim), no causal discount
        assert block.attention_flops == 4 * seq * seq * d
        assert block.boundary_bytes == seq * d * 2  # bf16 hidden states
        # row-parallel attention output and MLP output, all-reduced under tp
        assert block.tp_allreduce_bytes == 2 * seq * d * 2
    assert a.pre.matmul_flops == 0 and a.post.matmul_flops == 2 * seq * d * vocab
    # the PaLM/megalith MFU count: 6N per token plus 12 L d s, N with biases and norms
    bias_norm = models.num_flop_parameters(config) - layers * decoder_matmul_weights(config)
    forward = total(a, "matmul_flops") + total(a, "attention_flops")
    assert 3 * forward == (models.flops_per_token(config, seq) - 6 * (bias_norm - d * vocab)) * seq
    assert a.fwd_flops > forward  # norms, activations, the loss


def test_tp_params_follow_the_policy():
    config = models.get_config("llama-tiny")
    a = analyze(models.create(config), SEQ)
    d = config.d_model
    for block in a.blocks:
        assert block.tp_params == block.params - 2 * d  # all but the two RMSNorms
    assert a.pre.tp_params == config.vocab_size * d  # vocabulary-parallel embedding
    assert a.post.tp_params == config.vocab_size * d  # column-parallel lm_head


def test_model_without_a_policy_has_no_tp():
    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = torch.nn.ModuleList(torch.nn.Linear(32, 32) for _ in range(3))
            self.out = torch.nn.Linear(32, 10)

        def forward(self, input_ids):
            x = torch.nn.functional.one_hot(input_ids, 32).float()
            for layer in self.layers:
                x = torch.relu(layer(x))
            return self.out(x)

    a = analyze(Net(), 16, precision="fp32")
    assert a.family is None and len(a.blocks) == 3
    assert all(b.tp_params == 0 and b.tp_allreduce_bytes == 0 for b in all_parts(a))
    assert [b.matmul_flops for b in a.blocks] == [2 * 16 * 32 * 32] * 3
    assert a.post.matmul_flops == 2 * 16 * 32 * 10 and a.params == 3 * (32 * 32 + 32) + 330
    assert a.post.fwd_flops > a.post.matmul_flops  # the cross-entropy added over the logits


transformers = pytest.importorskip("transformers")


def hf_cases():
    t = transformers
    d, ff, h, v, layers = 64, 160, 4, 512, 3
    return {
        "gpt2": (
            lambda: t.GPT2LMHeadModel(
                t.GPT2Config(n_embd=d, n_layer=layers, n_head=h, vocab_size=v, n_inner=ff)
            ),
            layers * (4 * d * d + 2 * d * ff),  # c_attn, c_proj, c_fc, mlp c_proj
            d * v,  # tied lm_head
            layers,
        ),
        "llama": (
            lambda: t.LlamaForCausalLM(
                t.LlamaConfig(
                    hidden_size=d,
                    num_hidden_layers=layers,
                    num_attention_heads=h,
                    num_key_value_heads=2,
                    intermediate_size=ff,
                    vocab_size=v,
                )
            ),
            layers * (2 * d * d + 2 * d * (d // 2) + 3 * d * ff),  # kv heads half of q's
            d * v,
            layers,
        ),
        "bert": (
            lambda: t.BertForMaskedLM(
                t.BertConfig(
                    hidden_size=d,
                    num_hidden_layers=layers,
                    num_attention_heads=h,
                    intermediate_size=ff,
                    vocab_size=v,
                )
            ),
            layers * (4 * d * d + 2 * d * ff),
            d * d + d * v,  # the MLM head's transform and decoder
            layers,
        ),
        "t5": (
            lambda: t.T5ForConditionalGeneration(
                t.T5Config(
                    d_model=d,
                    d_ff=ff,
                    d_kv=16,
                    num_layers=2,
                    num_decoder_layers=2,
                    num_heads=h,
                    vocab_size=v,
                )
            ),
            # encoder layers: q k v o + wi wo; decoder layers add the cross-attention
            2 * (4 * d * d + 2 * d * ff) + 2 * (8 * d * d + 2 * d * ff),
            d * v,
            4,
        ),
    }


@pytest.mark.parametrize("family", ["gpt2", "llama", "bert", "t5"])
def test_transformers_tiny_models(family):
    build, block_weights, head_weights, layers = hf_cases()[family]
    with torch.device("meta"):
        model = build()
    a = analyze(model, SEQ)
    assert a.family == family and a.layers == layers
    assert a.params == sum(p.numel() for p in model.parameters())
    assert sum(b.matmul_flops for b in a.blocks) == 2 * SEQ * block_weights
    assert a.post.matmul_flops == 2 * SEQ * head_weights
    # one attention per encoder / decoder-only layer, two per T5 decoder layer
    attentions = layers + (2 if family == "t5" else 0)
    assert total(a, "attention_flops") == attentions * 4 * SEQ * SEQ * a.hidden
    assert all(b.activation_bytes > 0 and b.fwd_bytes > 0 for b in a.blocks)
    assert sum(b.tp_params for b in all_parts(a)) < a.params


def real_saved_bytes(model: torch.nn.Module, **inputs) -> int:
    """Bytes autograd saves in a real forward: each storage once, parameters not."""
    params = {p.untyped_storage()._cdata for p in model.parameters()}
    seen: set[int] = set()
    kept: list[torch.Tensor] = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        key = t.untyped_storage()._cdata
        if key not in params and key not in seen:
            seen.add(key)
        kept.append(t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(**inputs)
    by_key = {t.untyped_storage()._cdata: t.untyped_storage().nbytes() for t in kept}
    return sum(by_key[k] for k in seen)


@pytest.mark.parametrize("name", ["gpt-tiny", "llama-tiny"])
def test_saved_activations_equal_a_real_cpu_forward(name):
    model = models.create(name, device="cpu", seed=3).train()
    ids = torch.randint(0, model.config.vocab_size, (1, SEQ))
    real = real_saved_bytes(model, input_ids=ids, labels=ids)
    assert real > 0
    a = analyze(model, SEQ, precision="fp32")
    assert total(a, "activation_bytes") == real
    assert next(model.parameters()).device.type == "cpu"  # the model itself untouched


def test_saved_activations_hf_gpt2_with_dropout():
    """Residual and embedding dropout masks count. Attention dropout stays off: with it the
    CPU's SDPA leaves its fused kernel for the math path (a saved [s, s] matrix), which
    GPU runs, and so the analysis, do not take."""
    t = transformers
    config = t.GPT2Config(n_embd=64, n_layer=2, n_head=4, vocab_size=256, attn_pdrop=0.0)
    model = t.GPT2LMHeadModel(config)
    model.train()
    ids = torch.randint(0, 256, (1, SEQ))
    a = analyze(model, SEQ, precision="fp32")
    assert total(a, "activation_bytes") == real_saved_bytes(model, input_ids=ids, labels=ids)


@pytest.mark.parametrize("tie", [True, False])
def test_a_tied_head_is_seen_from_the_trace(tie):
    """tie_word_embeddings: the head's weight is the embedding's, counted in "pre" only."""
    t = transformers
    config = t.GPT2Config(n_embd=32, n_layer=1, n_head=4, vocab_size=128, tie_word_embeddings=tie)
    assert analyze(t.GPT2LMHeadModel(config), SEQ, precision="fp32").tied_head is tie


def test_llama_70b_on_meta_in_seconds():
    start = time.perf_counter()
    a = analyze(models.create("llama-70b"), 4096)
    assert time.perf_counter() - start < 10
    assert a.params == models.num_parameters(models.get_config("llama-70b"))
    assert len(a.blocks) == 80 and a.kv_heads == 8


def test_bad_arguments_name_the_fix():
    model = models.create("gpt-tiny")
    with pytest.raises(ValueError, match="precision must be one of"):
        analyze(model, 16, precision="int8")
    with pytest.raises(ValueError, match="seq_len must be positive"):
        analyze(model, 0)
    with pytest.raises(ValueError, match="no repeated blocks"):
        analyze(torch.nn.Linear(4, 4), 8)
