"""GPT-2: megalith.models.GPTLMHeadModel and transformers' GPT2Model, GPT2LMHeadModel,
GPT2DoubleHeadsModel, GPT2ForSequenceClassification, GPT2ForTokenClassification and
GPT2ForQuestionAnswering (their pipeline stages: gpt2_stages.py).

Both keep projections [in, out] (Conv1D layout) under the same names. Per block:
attn.c_attn is column-parallel over q, k and v separately (each rank its heads'
slice of each), attn.c_proj row-parallel; mlp.c_fc column-, mlp.c_proj
row-parallel. wte is vocabulary-parallel and lm_head (tied to it) column-parallel;
wpe and the norms are replicated, and so are the task heads (score, classifier,
qa_outputs, the multiple-choice summary): they read the full hidden states after the
last block, so every rank computes the same gradients for them without communication.
GPT2DoubleHeadsModel's lm_head always gathers its logits (ColossalAI's choice too).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..linear import ColumnParallelLinear, RowParallelLinear
from .base import DecoderPolicy, ShardContext
from .hf_version import check_transformers

HF_NAMES = (
    "GPT2Model",
    "GPT2LMHeadModel",
    "GPT2DoubleHeadsModel",
    "GPT2ForSequenceClassification",
    "GPT2ForTokenClassification",
    "GPT2ForQuestionAnswering",
)


def _is_hf(model: nn.Module) -> bool:
    cls = type(model)
    return cls.__name__ in HF_NAMES and cls.__module__.startswith("transformers.")


class ParallelGPTAttention(nn.Module):
    """megalith's GPT attention with this rank's heads (its forward reads d_model
    from the input, which no longer matches the local projection width)."""

    def __init__(self, attn: nn.Module, ctx: ShardContext) -> None:
        super().__init__()
        d = attn.c_attn.weight.shape[0]
        self.n_local_heads = attn.n_heads // ctx.tp
        self.local_width = d // ctx.tp
        self.dropout = attn.dropout
        self.c_attn = ColumnParallelLinear.from_linear(
            attn.c_attn, ctx.group, parts=(d, d, d), input_comm="none"
        )
        self.c_proj = RowParallelLinear.from_linear(
            attn.c_proj, ctx.group, sequence_parallel=ctx.sequence_parallel
        )
        self.resid_dropout = attn.resid_dropout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, _ = x.shape
        q, k, v = self.c_attn(x).split(self.local_width, dim=-1)
        q, k, v = (t.view(batch, seq, self.n_local_heads, -1).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(
            q, k, v, dropout_p=self.dropout if self.training else 0.0, is_causal=True
        )
        y = y.transpose(1, 2).reshape(batch, seq, self.local_width)
        return self.resid_dropout(self.c_proj(y))


class GPT2Policy(DecoderPolicy):
    name = "gpt2"
    embedding_path = "transformer.wte"
    blocks_path = "transformer.h"

    def matches(self, model: nn.Module) -> bool:
        from megalith.models import GPTLMHeadModel

        return isinstance(model, GPTLMHeadModel) or _is_hf(model)

    def has_lm_head(self, model: nn.Module) -> bool:
        return not _is_hf(model) or type(model).__name__ == "GPT2LMHeadModel"

    def pipeline_parts(
        self, model: nn.Module
    ) -> tuple[nn.Module, list[nn.Module], nn.Module] | None:
        if not _is_hf(model):
            return None  # megalith.models: the model's own pipeline_parts()
        from .gpt2_stages import gpt2_stages

        return gpt2_stages(model)

    def config_sizes(self, model: nn.Module) -> dict[str, int]:
        c = model.config
        if _is_hf(model):
            check_transformers()
            heads, d_ff = c.n_head, c.n_inner or 4 * c.n_embd
        else:
            heads, d_ff = c.n_heads, c.d_ff
        return {
            "the number of attention heads": heads,
            "the vocabulary size": c.vocab_size,
            "the MLP width (d_ff)": d_ff,
        }

    def shard_block(self, block: nn.Module, model: nn.Module, ctx: ShardContext) -> None:
        attn = block.attn
        if _is_hf(model):
            d = attn.embed_dim
            attn.c_attn = ColumnParallelLinear.from_linear(
                attn.c_attn, ctx.group, parts=(d, d, d), input_comm="none"
            )
            attn.c_proj = RowParallelLinear.from_linear(
                attn.c_proj, ctx.group, sequence_parallel=ctx.sequence_parallel
            )
            attn.num_heads //= ctx.tp
            attn.split_size //= ctx.tp
        else:
            block.attn = ParallelGPTAttention(attn, ctx)
        self.region(block.attn, ctx)
        mlp = block.mlp
        mlp.c_fc = ColumnParallelLinear.from_linear(mlp.c_fc, ctx.group, input_comm="none")
        mlp.c_proj = RowParallelLinear.from_linear(
            mlp.c_proj, ctx.group, sequence_parallel=ctx.sequence_parallel
        )
        self.region(mlp, ctx)
