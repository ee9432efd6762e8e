"""Policies shard megalith's and transformers' GPT-2 and Llama-shaped models in place;
the sharded model trains exactly as the unsharded one (CPU ranks, tp 2, tp 2 x dp 2,
tp 4 with replicated kv heads; with and without sequence parallelism).
"""

from __future__ import annotations

import pytest

from tests.tensor_parallel.custom import CustomCase
from tests.tensor_parallel.errors import ErrorCase
from tests.tensor_parallel.meta import MetaCase
from tests.tensor_parallel.models import ModelCase, run_cases
from tests.tensor_parallel.ulysses import UlyssesCase


def cases(world_size: int) -> list[ModelCase]:
    dp = world_size // 2
    out: list = [ErrorCase(tp=world_size)]
    if world_size == 2:  # every family and switch at tp 2
        for source in ("megalith", "hf"):
            for family in ("gpt2", "llama"):
                out.append(ModelCase(source, family, dp))
                out.append(ModelCase(source, family, dp, sp=True))
        out.append(ModelCase("megalith", "gpt2", dp, gather_logits=False))
        out.append(ModelCase("hf", "llama", dp, sp=True, gather_logits=False))
    else:  # tp 2 x dp 2: the data-parallel composition, once per source and family
        out.append(ModelCase("megalith", "gpt2", dp))
        out.append(ModelCase("hf", "llama", dp, sp=True, gather_logits=False))
    out.append(ModelCase("megalith", "llama", dp, sp=True, checkpointing=True))
    out.append(ModelCase("hf", "gpt2", dp, sp=True, checkpointing=True))
    if world_size == 2:
        out.append(CustomCase())
        out += [MetaCase("gpt2"), MetaCase("llama")]
        out += [UlyssesCase("gpt2"), UlyssesCase("llama")]
        out.append(ModelCase("hf", "mistral", 1, sp=True))
        out.append(ModelCase("hf", "qwen2", 1))
        out.append(ModelCase("hf", "qwen3", 1, sp=True))
    if world_size == 4:
        # kv heads (2) fewer than tp (4): replicated, each rank its query heads' kv head.
        out.append(ModelCase("megalith", "llama", 1, tp=4, sp=True))
        out.append(ModelCase("hf", "llama", 1, tp=4))
        out.append(ModelCase("hf", "qwen3", 1, tp=4))
        out.append(UlyssesCase("llama", sp=4))  # 2 kv heads over 4 ranks: expanded first
    return out


@pytest.mark.parametrize("world_size", [2, 4])
def test_policies_match_unsharded(world_size):
    run_cases(cases(world_size), world_size)
