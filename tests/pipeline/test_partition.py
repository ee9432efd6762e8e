"""Cutting models into stages: the balancing, the accepted model forms, the adapters."""

from __future__ import annotations

import itertools
import random

import pytest
import torch
from torch import nn

from megalith_pipeline import PipelineParts, as_layers, gpt2_parts, llama_parts, partition
from megalith_pipeline.layers import named_ties
from megalith_pipeline.partition import Partition, balance_costs, param_costs
from megalith_pipeline.tree import flatten, split_microbatches, unflatten
from tests.pipeline import models


def _brute(costs: list[float], k: int) -> float:
    n = len(costs)
    best = float("inf")
    for cuts in itertools.combinations(range(1, n), k - 1):
        b = (0, *cuts, n)
        best = min(best, max(sum(costs[i:j]) for i, j in itertools.pairwise(b)))
    return best


def test_balance_is_optimal():
    rng = random.Random(0)
    for _ in range(200):
        n, k = rng.randint(1, 9), rng.randint(1, 5)
        if n < k:
            continue
        costs = [rng.choice([0.0, 1.0, 2.5, 7.0, rng.random() * 10]) for _ in range(n)]
        plan = balance_costs(costs, k)
        assert plan.num_stages == k and min(plan.sizes) >= 1 and sum(plan.sizes) == n
        assert max(plan.stage_costs()) == pytest.approx(_brute(costs, k))


def test_balance_modes():
    model = models.mlp(10)
    assert partition(list(model), 4).sizes == (3, 3, 2, 2)
    assert partition(list(model), 4, [1, 2, 3, 4]).sizes == (1, 2, 3, 4)
    wide = [nn.Linear(4, 100), nn.Linear(100, 4), nn.Linear(4, 4), nn.Linear(4, 4)]
    assert param_costs(wide) == [500.0, 404.0, 20.0, 20.0]
    assert partition(wide, 2, "params").sizes == (1, 3)
    tied = nn.Linear(4, 4)
    assert param_costs([tied, tied]) == [20.0, 0.0]  # a shared parameter counts once
    assert partition(wide, 2, costs=[1, 1, 1, 5]).sizes == (3, 1)
    slow = [models.Sleepy(0.002, 0, 0), models.Sleepy(0.0, 0, 0), models.Sleepy(0.0, 0, 0)]
    assert partition(slow, 2, "time", sample=torch.randn(2, 4)).sizes == (1, 2)
    assert Partition.from_sizes([2, 1]).layers(1) == range(2, 3)


def test_partition_errors_name_the_numbers():
    layers = list(models.mlp(4))
    with pytest.raises(ValueError, match="4 layers cannot fill 8 stages"):
        partition(layers, 8)
    with pytest.raises(ValueError, match=r"balance=\[1, 2\] must give 3 stages"):
        partition(layers, 3, [1, 2])
    with pytest.raises(ValueError, match="balance='time' needs sample="):
        partition(layers, 2, "time")
    with pytest.raises(ValueError, match="balance='flops'"):
        partition(layers, 2, "flops")


def _run(layers, x):
    for layer in layers:
        x = layer(x)
    return x


def test_model_forms_and_adapters():
    torch.manual_seed(0)
    seq = models.mlp(5)
    assert as_layers(seq) == list(seq) == as_layers(list(seq)) == as_layers(nn.ModuleList(seq))
    parts = PipelineParts(seq[0], list(seq[1:4]), seq[4])
    assert as_layers(parts) == list(seq)

    class Triple(
        nn.Module
    ):  # the reference models' form: pipeline_parts() -> (embed, blocks, head)
        def __init__(self):
            super().__init__()
            self.seq = seq

        def pipeline_parts(self):
            return seq[0], list(seq[1:4]), seq[4]

    assert as_layers(Triple()) == list(seq)
    gpt = models.tiny_gpt2(3)
    ids = torch.randint(0, 32, (2, 8))
    layers = as_layers(gpt)
    assert len(layers) == 5 and len(gpt2_parts(gpt).blocks) == 3
    assert torch.allclose(_run(layers, ids), gpt(ids))
    with pytest.raises(TypeError, match="cannot split a Linear"):
        as_layers(nn.Linear(2, 2))
    with pytest.raises(TypeError, match=r"layers must be nn\.Modules"):
        as_layers([nn.Linear(2, 2), "relu"])


class _Rotary(nn.Module):
    def forward(self, x, pos):
        freq = pos[..., None].float() / 10
        return freq.cos().expand(*pos.shape, x.shape[-1]), freq.sin().expand(
            *pos.shape, x.shape[-1]
        )


class _LlamaLayer(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, hidden, position_embeddings):
        cos, sin = position_embeddings
        return (hidden + torch.tanh(self.lin(hidden * cos + sin)),)


class _LlamaInner(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed_tokens = nn.Embedding(16, 8)
        self.layers = nn.ModuleList(_LlamaLayer() for _ in range(2))
        self.norm = nn.LayerNorm(8)
        self.rotary_emb = _Rotary()


class _Llama(nn.Module):
    """transformers' LlamaForCausalLM layout and call signature, in miniature."""

    def __init__(self):
        super().__init__()
        self.model = _LlamaInner()
        self.lm_head = nn.Linear(8, 16, bias=False)

    def forward(self, ids):
        m = self.model
        h = m.embed_tokens(ids)
        cos, sin = m.rotary_emb(h, torch.arange(ids.shape[1]).expand(ids.shape[0], -1))
        for layer in m.layers:
            h = layer(h, position_embeddings=(cos, sin))[0]
        return self.lm_head(m.norm(h))


def test_llama_layout_passes_rotary_tensors_without_grad():
    torch.manual_seed(0)
    model = _Llama()
    ids = torch.randint(0, 16, (2, 5))
    layers = as_layers(model)
    assert len(layers) == 4 and len(llama_parts(model).blocks) == 2
    assert torch.allclose(_run(layers, ids), model(ids))
    hidden, cos, sin = layers[0](ids)
    assert hidden.requires_grad and not cos.requires_grad and not sin.requires_grad


def test_named_ties_find_copies_held_apart():
    gpt = models.tiny_gpt2(2)
    gpt.tied_weights = {"lm_head.weight": "transformer.wte.weight"}
    assert named_ties(gpt) == []  # one Parameter: identity already ties it
    gpt.lm_head.weight = nn.Parameter(gpt.transformer.wte.weight.detach().clone())
    ((a, b),) = named_ties(gpt)
    assert a is gpt.lm_head.weight and b is gpt.transformer.wte.weight


def test_trees_and_microbatches():
    x = {
        "a": torch.arange(10).reshape(5, 2),
        "b": (torch.ones(5), None, 3),
        "c": [torch.zeros(5, 1)],
    }
    tensors, spec = flatten(x)
    assert len(tensors) == 3
    back = unflatten(spec, tensors)
    assert back["b"][1] is None and back["b"][2] == 3 and isinstance(back["c"], list)
    pieces, sizes = split_microbatches(x, 3, "inputs")
    assert sizes == [2, 2, 1] and pieces[2]["a"].tolist() == [[8, 9]] and pieces[0]["b"][2] == 3
    with pytest.raises(ValueError, match="batch size 5, fewer than num_microbatches=6"):
        split_microbatches(x, 6, "inputs")
    with pytest.raises(ValueError, match=r"same batch dimension 0.*\(5,\), \(4,\)"):
        split_microbatches((torch.ones(5), torch.ones(4)), 2, "inputs")
    with pytest.raises(TypeError, match="exchange tensors"):
        flatten(object())
