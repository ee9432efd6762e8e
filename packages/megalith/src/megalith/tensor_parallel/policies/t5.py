"""T5: transformers' T5ForConditionalGeneration, T5EncoderModel and the other T5*
models (T5Model, T5ForSequenceClassification, T5ForTokenClassification,
T5ForQuestionAnswering); v1.0 (DenseReluDense: wi, wo) and v1.1 (gated: wi_0, wi_1, wo).

Every T5Attention (encoder and decoder self-attention, decoder cross-attention):
q, k, v column-parallel by heads, o row-parallel. The relative attention bias, an
Embedding of [buckets, heads], has its columns split so each rank keeps its own
heads' biases (the position bias the first block computes and passes on is then
already per rank). In cross-attention, k and v read the encoder's output rather
than the hidden states the region hook prepares, so they copy it into the region
themselves. wi / wi_0 / wi_1 are column-, wo row-parallel. The layer norms are
replicated.

The shared embedding (and every embed_tokens tied to it) is vocabulary-parallel;
lm_head is column-parallel over the same rows, tied to it or not as the model is
(transformers 5 always ties; an untied copy is split the same way).
"""

from __future__ import annotations

from torch import nn

from ..embedding import VocabParallelEmbedding
from ..linear import ColumnParallelLinear, RowParallelLinear
from ..sequence import enter_region, reduce_partial_grads, sequence_parallel_span
from ..shards import ShardSpec, check_divisible, shard_parameter
from .base import Policy, ShardContext
from .hf_version import check_transformers

HF_NAMES = (
    "T5ForConditionalGeneration",
    "T5EncoderModel",
    "T5Model",
    "T5ForSequenceClassification",
    "T5ForTokenClassification",
    "T5ForQuestionAnswering",
)
FEED_FORWARD = ("T5DenseActDense", "T5DenseGatedActDense")


def _hf(model: nn.Module) -> bool:
    cls = type(model)
    return cls.__name__ in HF_NAMES and cls.__module__.startswith("transformers.")


def _named(model: nn.Module, *names: str) -> list[nn.Module]:
    return [m for m in model.modules() if type(m).__name__ in names]


class T5Policy(Policy):
    name = "t5"

    def matches(self, model: nn.Module) -> bool:
        return _hf(model)

    def pipeline_parts(self, model: nn.Module) -> tuple[nn.Module, list[nn.Module], nn.Module]:
        from .t5_stages import t5_stages

        if type(model).__name__ in ("T5ForSequenceClassification", "T5ForQuestionAnswering"):
            raise ValueError(
                f"pipeline: {type(model).__name__} is not cut into stages (ColossalAI does not "
                "either); run it with pp_size=1, or pipeline T5Model / T5EncoderModel / "
                "T5ForConditionalGeneration / T5ForTokenClassification"
            )

        return t5_stages(model)

    def validate(self, model: nn.Module, tp: int) -> None:
        check_transformers()
        c = model.config
        check_divisible("the number of attention heads", c.num_heads, tp)
        check_divisible("the vocabulary size", c.vocab_size, tp)
        check_divisible("the MLP width (d_ff)", c.d_ff, tp)

    def shard(self, model: nn.Module, ctx: ShardContext) -> None:
        g, sp = ctx.group, ctx.sequence_parallel
        self._shard_embeddings(model, ctx)
        cross = {id(layer.EncDecAttention) for layer in _named(model, "T5LayerCrossAttention")}
        for attn in _named(model, "T5Attention"):
            attn.q = ColumnParallelLinear.from_linear(attn.q, g, input_comm="none")
            kv_comm = "copy" if id(attn) in cross else "none"
            attn.k = ColumnParallelLinear.from_linear(attn.k, g, input_comm=kv_comm)
            attn.v = ColumnParallelLinear.from_linear(attn.v, g, input_comm=kv_comm)
            attn.o = RowParallelLinear.from_linear(attn.o, g, sequence_parallel=sp)
            if attn.has_relative_attention_bias:
                bias = attn.relative_attention_bias
                bias.weight = shard_parameter(
                    bias.weight, ShardSpec(1, (attn.n_heads,)), g.rank, g.size,
                    "the number of attention heads",
                )  # fmt: skip
                bias.embedding_dim //= ctx.tp
            attn.n_heads //= ctx.tp
            attn.inner_dim //= ctx.tp
            enter_region(attn, g, sp)
        for ff in _named(model, *FEED_FORWARD):
            for name in ("wi", "wi_0", "wi_1"):
                if hasattr(ff, name):
                    new = ColumnParallelLinear.from_linear(getattr(ff, name), g, input_comm="none")
                    setattr(ff, name, new)
            ff.wo = RowParallelLinear.from_linear(ff.wo, g, sequence_parallel=sp)
            enter_region(ff, g, sp)
        if sp:
            for stack in _named(model, "T5Stack"):
                blocks = stack.block
                sequence_parallel_span(blocks[0], blocks[-1], g)
                replicated = [
                    p for b in blocks for p in b.parameters() if not hasattr(p, "tp_spec")
                ]
                reduce_partial_grads(replicated, g)

    @staticmethod
    def _shard_embeddings(model: nn.Module, ctx: ShardContext) -> None:
        """shared, encoder/decoder.embed_tokens (one weight) and lm_head."""
        shared = model.get_input_embeddings()
        old = shared.weight
        sharded = None
        for name, mod in list(model.named_modules()):
            if isinstance(mod, nn.Embedding) and mod.weight is old:
                new = VocabParallelEmbedding.from_embedding(mod, ctx.group)
                if sharded is None:
                    sharded = new.weight
                new.weight = sharded
                parent, _, attr = name.rpartition(".")
                setattr(model.get_submodule(parent), attr, new)
        lm_head = getattr(model, "lm_head", None)
        if lm_head is not None:
            tied = lm_head.weight is old
            new_head = ColumnParallelLinear.from_linear(
                lm_head, ctx.group, gather_output=ctx.gather_logits
            )
            if tied:
                new_head.weight = sharded
            model.lm_head = new_head
