"""Reference models: lazy creation on meta, deterministic materialisation, init
statistics, and activation checkpointing.
"""

from __future__ import annotations

import math
import resource

import pytest
import torch

from megalith import models

TINY = ("gpt-tiny", "llama-tiny")


def states_equal(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def test_meta_creation_of_70b_allocates_nothing():
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    model = models.create("llama-70b", dtype=torch.bfloat16)
    grown_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    assert all(p.is_meta for p in model.parameters())
    assert all(p.dtype == torch.bfloat16 for p in model.parameters())
    assert models.num_parameters(model) > 68e9
    assert grown_mib < 200, f"peak memory grew {grown_mib:.0f} MiB creating a meta model"


@pytest.mark.parametrize("name", TINY)
def test_same_seed_same_values_on_every_path(name):
    lazy = models.create(name, vocab_size=64)
    assert all(p.is_meta for p in lazy.parameters())
    models.materialize(lazy, device="cpu", seed=7)
    eager = models.create(name, device="cpu", seed=7, vocab_size=64)
    assert states_equal(lazy, eager)
    other = models.create(name, device="cpu", seed=8, vocab_size=64)
    assert not torch.equal(other.lm_head.weight, eager.lm_head.weight)
    if lazy.config.tie_word_embeddings:
        assert lazy.lm_head.weight is lazy.transformer.wte.weight


@pytest.mark.parametrize("name", TINY)
def test_a_part_materialised_alone_gets_the_whole_models_values(name):
    """What a pipeline stage or ZeRO-3 rank does: give storage to its part only, then init."""
    whole = models.create(name, device="cpu", seed=3, vocab_size=64)
    stage = models.create(name, vocab_size=64)
    _, blocks, _ = stage.pipeline_parts()
    blocks[2].to_empty(device="cpu")
    stage.init_weights(seed=3)
    assert states_equal(blocks[2], whole.pipeline_parts()[1][2])
    assert all(p.is_meta for p in blocks[1].parameters())


def test_a_tied_head_materialised_apart_matches_the_embedding():
    """The last pipeline stage holds its own copy of GPT's tied lm_head."""
    whole = models.create("gpt-tiny", device="cpu", seed=3, vocab_size=64)
    stage = models.create("gpt-tiny", vocab_size=64)
    head = stage.pipeline_parts()[2]
    head.to_empty(device="cpu")
    stage.init_weights(seed=3)
    assert torch.equal(head.lm_head.weight, whole.transformer.wte.weight)
    assert torch.equal(head.norm.weight, whole.transformer.ln_f.weight)
    assert stage.transformer.wte.weight.is_meta


def test_dtype_is_the_fp32_values_rounded():
    full = models.create("llama-tiny", device="cpu", seed=5, vocab_size=64)
    half = models.create("llama-tiny", device="cpu", seed=5, vocab_size=64, dtype=torch.bfloat16)
    for (name, a), b in zip(full.state_dict().items(), half.state_dict().values()):
        assert b.dtype == torch.bfloat16, name
        assert torch.equal(a.to(torch.bfloat16), b), name


def test_gpt2_init_statistics():
    model = models.create("gpt-tiny", device="cpu", seed=0, d_model=256, n_heads=4, d_ff=1024)
    layers = model.config.n_layers
    block = model.transformer.h[1]
    for p in (block.attn.c_attn.weight, block.mlp.c_fc.weight, model.transformer.wte.weight):
        assert p.std().item() == pytest.approx(0.02, rel=0.03)
    for p in (block.attn.c_proj.weight, block.mlp.c_proj.weight):
        assert p.std().item() == pytest.approx(0.02 / math.sqrt(2 * layers), rel=0.03)
    assert torch.all(block.ln_1.weight == 1) and torch.all(block.ln_2.bias == 0)
    assert torch.all(block.attn.c_attn.bias == 0) and torch.all(model.transformer.ln_f.weight == 1)
    assert abs(block.mlp.c_fc.weight.mean().item()) < 1e-3


def test_llama_init_statistics():
    model = models.create("llama-tiny", device="cpu", seed=0, d_model=256, d_ff=704)
    layer = model.model.layers[0]
    for p in (layer.self_attn.q_proj.weight, layer.self_attn.o_proj.weight, layer.mlp.down_proj.weight,
              model.model.embed_tokens.weight, model.lm_head.weight):  # fmt: skip
        assert p.std().item() == pytest.approx(0.02, rel=0.05)
    for norm in (layer.input_layernorm, layer.post_attention_layernorm, model.model.norm):
        assert torch.all(norm.weight == 1)


def grads_of(model: models.CausalLM, ids: torch.Tensor, seed: int) -> dict[str, torch.Tensor]:
    model.zero_grad(set_to_none=True)
    torch.manual_seed(seed)  # dropout masks
    model(ids, labels=ids).loss.backward()
    return {name: p.grad.clone() for name, p in model.named_parameters()}


@pytest.mark.parametrize(
    ("name", "dropout"), [("gpt-tiny", 0.0), ("gpt-tiny", 0.1), ("llama-tiny", None)]
)
def test_activation_checkpointing_gives_identical_grads(name, dropout):
    extra = {} if dropout is None else {"dropout": dropout}
    model = models.create(name, device="cpu", seed=2, vocab_size=64, **extra)
    model.train()
    ids = torch.randint(0, 64, (2, 24), generator=torch.Generator().manual_seed(0))
    plain = grads_of(model, ids, seed=11)

    calls = []
    first_block = model.blocks[0]
    hook = next(iter(first_block.children())).register_forward_hook(lambda *_: calls.append(1))
    model.set_activation_checkpointing(True)
    assert all(b.activation_checkpointing for b in model.blocks)
    checkpointed = grads_of(model, ids, seed=11)
    hook.remove()
    assert len(calls) == 2, "the block's forward should run again in backward"
    for key, grad in plain.items():
        assert torch.equal(grad, checkpointed[key]), key

    model.set_activation_checkpointing(False, blocks=[0])
    assert not model.blocks[0].activation_checkpointing and model.blocks[1].activation_checkpointing
    with torch.no_grad():  # no recomputation without autograd
        model(ids)


def test_create_with_checkpointing_switch():
    model = models.create("llama-tiny", activation_checkpointing=True)
    assert all(b.activation_checkpointing for b in model.blocks)
