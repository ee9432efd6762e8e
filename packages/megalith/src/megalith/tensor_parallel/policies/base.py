"""Policies: how a model family is sharded in place, and shard_model, which picks one.

A Policy says which linears are column- or row-parallel, which embeddings are
vocabulary-parallel and how attention heads split. It first validates (every
size against tp, so a bad tp fails before any module changes and before any
collective), then shards. Users pass their own Policy for other models.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from megalith_comm import ProcessGroup

from ..embedding import VocabParallelEmbedding
from ..linear import ColumnParallelLinear
from ..sequence import enter_region, reduce_partial_grads, sequence_parallel_span
from ..shards import check_divisible


@dataclass(frozen=True)
class ShardContext:
    """What a policy needs: the tensor-parallel group and the options.

    sequence_parallel: Megatron-style; the decoder blocks run on sequence shards.
    gather_logits: lm_head all-gathers the vocabulary (any loss works); False keeps
    vocabulary-parallel logits for vocab_parallel_causal_lm_loss.
    """

    group: ProcessGroup
    sequence_parallel: bool = False
    gather_logits: bool = True

    @property
    def tp(self) -> int:
        return self.group.size


class Policy:
    """Shards one family of models in place. Subclass validate() and shard_blocks()."""

    name = "custom"

    def matches(self, model: nn.Module) -> bool:
        return False

    def validate(self, model: nn.Module, tp: int) -> None:
        """Raises ValueError naming the numbers when tp does not fit the model."""

    def shard(self, model: nn.Module, ctx: ShardContext) -> None:
        raise NotImplementedError

    def has_lm_head(self, model: nn.Module) -> bool:
        """Whether the model ends in a causal-LM vocabulary projection whose logits
        HybridParallelPlugin(parallel_output=True) keeps vocabulary-parallel (ColossalAI
        does so for causal LMs only; other heads' logits are gathered)."""
        return False

    def pipeline_parts(
        self, model: nn.Module
    ) -> tuple[nn.Module, list[nn.Module], nn.Module] | None:
        """(embed, blocks, head) for a pipeline (stages.py), or None: megalith_pipeline cuts
        the model by its own rules (its pipeline_parts(), an nn.Sequential, a GPT-2 or
        Llama layout)."""
        return None


@dataclass(frozen=True)
class TPInfo:
    """Stored on a sharded model as `model.tp_info`."""

    group: ProcessGroup
    sequence_parallel: bool
    gather_logits: bool
    policy: str


class DecoderPolicy(Policy):
    """A decoder-only LM laid out as transformers lays them out: embedding, blocks,
    final norm, lm_head. Subclasses name the modules and shard one block."""

    embedding_path = ""
    blocks_path = ""

    def config_sizes(self, model: nn.Module) -> dict[str, int]:
        """{what: size} of every size tp must divide (heads, vocabulary, features)."""
        raise NotImplementedError

    def validate(self, model: nn.Module, tp: int) -> None:
        for what, size in self.config_sizes(model).items():
            check_divisible(what, size, tp)

    def shard_block(self, block: nn.Module, model: nn.Module, ctx: ShardContext) -> None:
        raise NotImplementedError

    def paths(self, model: nn.Module) -> tuple[str, str]:
        """(embedding path, blocks path) in this model: a head model's, or the bare
        trunk's (GPT2Model, LlamaModel) without the trunk's prefix."""
        trunk = self.blocks_path.partition(".")[0]
        if hasattr(model, trunk):
            return self.embedding_path, self.blocks_path
        return self.embedding_path.partition(".")[2], self.blocks_path.partition(".")[2]

    def shard(self, model: nn.Module, ctx: ShardContext) -> None:
        embedding_path, blocks_path = self.paths(model)
        parent_path, _, attr = embedding_path.rpartition(".")
        parent = model.get_submodule(parent_path)
        old_embedding = getattr(parent, attr)
        embedding = VocabParallelEmbedding.from_embedding(old_embedding, ctx.group)
        setattr(parent, attr, embedding)
        head = getattr(model, "lm_head", None)
        if head is not None:  # task heads (score, classifier, qa_outputs) stay replicated
            tied = head.weight is old_embedding.weight
            gather = ctx.gather_logits or not self.has_lm_head(model)
            lm_head = ColumnParallelLinear.from_linear(head, ctx.group, gather_output=gather)
            if tied:
                lm_head.weight = embedding.weight
            model.lm_head = lm_head
        blocks = model.get_submodule(blocks_path)
        for block in blocks:
            self.shard_block(block, model, ctx)
        if ctx.sequence_parallel and len(blocks):
            sequence_parallel_span(blocks[0], blocks[-1], ctx.group)
            replicated = [p for b in blocks for p in b.parameters() if not hasattr(p, "tp_spec")]
            reduce_partial_grads(replicated, ctx.group)

    @staticmethod
    def region(module: nn.Module, ctx: ShardContext) -> None:
        enter_region(module, ctx.group, ctx.sequence_parallel)
