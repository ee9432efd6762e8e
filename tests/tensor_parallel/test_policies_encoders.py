"""Policies shard transformers' BERT and T5 models in place; the sharded model trains
exactly as the unsharded one (CPU ranks, tp 2 and tp 2 x dp 2, tp 4 at world 4;
with and without sequence parallelism), and sizes tp cannot split fail first.
"""

from __future__ import annotations

import pytest

from tests.tensor_parallel.encoders import EncoderCase, EncoderErrorCase
from tests.tensor_parallel.models import run_cases


def cases(world_size: int) -> list:
    dp = world_size // 2
    out: list = [EncoderErrorCase(tp=world_size)]
    if world_size == 2:  # every model at tp 2
        for model in ("bert-mlm", "bert-cls", "t5", "t5-v1.1"):
            out.append(EncoderCase(model, dp))
    else:  # tp 2 x dp 2: the data-parallel composition, one encoder and one encoder-decoder
        out.append(EncoderCase("bert-cls", dp))
    out.append(EncoderCase("bert-mlm", dp, sp=True))
    out.append(EncoderCase("t5-v1.1", dp, sp=True))
    if world_size == 2:
        out += [EncoderCase("bert"), EncoderCase("t5-encoder"), EncoderCase("t5-encoder", sp=True)]
    if world_size == 4:  # one head per rank
        out += [EncoderCase("bert-cls", 1, tp=4), EncoderCase("t5", 1, tp=4, sp=True)]
    return out


@pytest.mark.parametrize("world_size", [2, 4])
def test_encoder_policies_match_unsharded(world_size):
    run_cases(cases(world_size), world_size)
