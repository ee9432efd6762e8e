"""Sizes that tensor parallelism cannot split fail on every rank, before any collective,
with the numbers in the message."""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
from torch import nn

import megalith.models as mm
from megalith.tensor_parallel import ColumnParallelLinear, RowParallelLinear, shard_model
from tests.tensor_parallel.common import expect_value_error, mesh


@dataclass(frozen=True)
class ErrorCase:
    tp: int = 2

    def run(self, rank: int) -> tuple[list[str], float]:
        start = time.perf_counter()
        group = mesh(1, self.tp).group("tp")
        tp = str(self.tp)
        issued = group.issued
        errors: list[str] = []
        expect_value_error(errors, "column", lambda: ColumnParallelLinear(8, 7, group), "7", tp)
        expect_value_error(errors, "row", lambda: RowParallelLinear(9, 4, group), "9", tp)

        def gpt(**kw):
            base = dict(vocab_size=64, max_seq_len=8, d_model=48, n_layers=1, n_heads=4, d_ff=64)
            return mm.create(mm.GPTConfig(**{**base, **kw}), device="cpu")

        def llama(**kw):
            base = dict(vocab_size=64, max_seq_len=8, d_model=48, n_layers=1, n_heads=4, d_ff=64)
            return mm.create(mm.LlamaConfig(**{**base, **kw}), device="cpu")

        expect_value_error(
            errors, "heads", lambda: shard_model(gpt(n_heads=3), group), "heads", "(3)", tp
        )
        expect_value_error(
            errors, "vocab", lambda: shard_model(gpt(vocab_size=63), group), "63", tp
        )
        expect_value_error(errors, "d_ff", lambda: shard_model(llama(d_ff=65), group), "65", tp)
        if self.tp == 2:  # 6 heads, 3 kv heads: neither 3 % 2 nor 2 % 3 is 0
            m = llama(n_heads=6, n_kv_heads=3)
            expect_value_error(
                errors, "kv heads", lambda: shard_model(m, group), "3 key/value heads", tp
            )
            untouched = isinstance(m.model.layers[0].self_attn.q_proj, nn.Linear)
            if not untouched:
                errors.append("a failed shard_model changed the model")
        expect_value_error(
            errors, "unsupported", lambda: shard_model(nn.Linear(2, 2), group), "GPT2LMHeadModel"
        )
        m = gpt()
        shard_model(m, group, sequence_parallel=True)
        expect_value_error(
            errors, "odd sequence", lambda: m(torch.zeros(1, 3, dtype=torch.long)), "3", tp
        )
        if group.issued - issued > 1:  # the embedding's all-reduce runs before the split
            errors.append(f"{group.issued - issued} collectives issued before the errors")
        return errors, time.perf_counter() - start
