"""BERT: transformers' BertModel and the Bert* heads built on it (BertForMaskedLM,
BertForSequenceClassification, BertForPreTraining, BertLMHeadModel, ...).

Per layer: attention.self's query, key and value are column-parallel (each rank
its heads), attention.output.dense row-parallel; intermediate.dense column-,
output.dense row-parallel. LayerNorms, position and token-type embeddings, the
pooler and the small classifier heads are replicated: they sit outside the
parallel regions, see the same full hidden states on every rank and so get the
same gradients without communication.

word_embeddings is vocabulary-parallel. The MLM decoder is tied to it, so it is
column-parallel over the same vocabulary rows, and its bias (tied to
cls.predictions.bias) is split with it; logits are all-gathered unless
gather_logits=False. Splitting the table even where no decoder reads it keeps one
layout for every Bert* model, so their checkpoints convert alike.
"""

from __future__ import annotations

from torch import nn

from ..embedding import VocabParallelEmbedding
from ..linear import ColumnParallelLinear, RowParallelLinear
from ..sequence import enter_region, reduce_partial_grads, sequence_parallel_span
from ..shards import check_divisible
from .base import Policy, ShardContext
from .hf_version import check_transformers

HF_NAMES = (
    "BertModel",
    "BertForMaskedLM",
    "BertForSequenceClassification",
    "BertForPreTraining",
    "BertLMHeadModel",
    "BertForNextSentencePrediction",
    "BertForMultipleChoice",
    "BertForTokenClassification",
    "BertForQuestionAnswering",
)


def _hf(model: nn.Module) -> bool:
    cls = type(model)
    return cls.__name__ in HF_NAMES and cls.__module__.startswith("transformers.")


def _named(model: nn.Module, name: str) -> list[nn.Module]:
    return [m for m in model.modules() if type(m).__name__ == name]


class BertPolicy(Policy):
    name = "bert"

    def matches(self, model: nn.Module) -> bool:
        return _hf(model)

    def pipeline_parts(self, model: nn.Module) -> tuple[nn.Module, list[nn.Module], nn.Module]:
        from .bert_stages import bert_stages

        return bert_stages(model)

    def validate(self, model: nn.Module, tp: int) -> None:
        check_transformers()
        c = model.config
        if getattr(c, "add_cross_attention", False):
            raise ValueError(
                "tensor-parallel BERT with cross-attention (config.add_cross_attention=True) "
                "is not supported yet"
            )
        check_divisible("the number of attention heads", c.num_attention_heads, tp)
        check_divisible("the vocabulary size", c.vocab_size, tp)
        check_divisible("the MLP width (intermediate size)", c.intermediate_size, tp)

    def shard(self, model: nn.Module, ctx: ShardContext) -> None:
        g, sp = ctx.group, ctx.sequence_parallel
        base = getattr(model, "bert", model)
        old_embedding = base.embeddings.word_embeddings
        embedding = VocabParallelEmbedding.from_embedding(old_embedding, g)
        base.embeddings.word_embeddings = embedding
        for head in _named(model, "BertLMPredictionHead"):
            tied = head.decoder.weight is old_embedding.weight
            decoder = ColumnParallelLinear.from_linear(
                head.decoder, g, gather_output=ctx.gather_logits
            )
            if tied:
                decoder.weight = embedding.weight
            if head.bias is head.decoder.bias:
                head.bias = decoder.bias
            head.decoder = decoder
        for attn in _named(model, "BertSelfAttention"):
            for name in ("query", "key", "value"):
                new = ColumnParallelLinear.from_linear(getattr(attn, name), g, input_comm="none")
                setattr(attn, name, new)
            attn.num_attention_heads //= ctx.tp
            attn.all_head_size //= ctx.tp
            enter_region(attn, g, sp)
        for out in _named(model, "BertSelfOutput") + _named(model, "BertOutput"):
            out.dense = RowParallelLinear.from_linear(out.dense, g, sequence_parallel=sp)
        for mlp in _named(model, "BertIntermediate"):
            mlp.dense = ColumnParallelLinear.from_linear(mlp.dense, g, input_comm="none")
            enter_region(mlp, g, sp)
        layers = base.encoder.layer
        if sp and len(layers):
            sequence_parallel_span(layers[0], layers[-1], g)
            replicated = [p for b in layers for p in b.parameters() if not hasattr(p, "tp_spec")]
            reduce_partial_grads(replicated, g)
