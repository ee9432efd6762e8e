"""Llama-shaped decoders: megalith.models.LlamaForCausalLM and transformers' Llama,
Mistral, Qwen2 and Qwen3 models: *Model, *ForCausalLM and *ForSequenceClassification
(same module names; Qwen3 adds per-head q_norm / k_norm; pipeline stages:
llama_stages.py). The classification score is replicated (it reads the full hidden
states after the last layer).

Per layer: q_proj column-parallel by heads; k_proj / v_proj column-parallel when
tp divides the kv heads, else replicated with each rank using its query heads'
kv head (heads.py); o_proj row-parallel; gate_proj and up_proj column-, down_proj
row-parallel. embed_tokens is vocabulary-parallel, lm_head column-parallel.
Per-head norms (Qwen3's q_norm, k_norm) are replicated, but each rank applies them
to its heads only, so their gradients are all-reduced over the group.
"""

from __future__ import annotations

from torch import nn

from ..heads import HeadSplit
from ..linear import ColumnParallelLinear, HeadRowsLinear, RowParallelLinear
from ..sequence import add_grad_all_reduce
from .base import DecoderPolicy, ShardContext
from .hf_version import check_transformers

FAMILIES = ("Llama", "Mistral", "Qwen2", "Qwen3")
HEADS = ("Model", "ForCausalLM", "ForSequenceClassification")
HF_NAMES = tuple(f + h for f in FAMILIES for h in HEADS)


def _hf(model: nn.Module) -> bool:
    cls = type(model)
    return cls.__name__ in HF_NAMES and cls.__module__.startswith("transformers.")


class LlamaPolicy(DecoderPolicy):
    name = "llama"
    embedding_path = "model.embed_tokens"
    blocks_path = "model.layers"

    def matches(self, model: nn.Module) -> bool:
        from megalith.models import LlamaForCausalLM

        return isinstance(model, LlamaForCausalLM) or _hf(model)

    def has_lm_head(self, model: nn.Module) -> bool:
        return not _hf(model) or type(model).__name__.endswith("ForCausalLM")

    def pipeline_parts(
        self, model: nn.Module
    ) -> tuple[nn.Module, list[nn.Module], nn.Module] | None:
        if not _hf(model):
            return None  # megalith.models: the model's own pipeline_parts()
        from .llama_stages import llama_stages

        return llama_stages(model)

    def heads(self, model: nn.Module) -> tuple[int, int, int]:
        """(query heads, kv heads, head_dim)."""
        c = model.config
        if _hf(model):
            kv = getattr(c, "num_key_value_heads", None) or c.num_attention_heads
            head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
            return c.num_attention_heads, kv, head_dim
        return c.n_heads, c.num_kv_heads, c.head_dim

    def config_sizes(self, model: nn.Module) -> dict[str, int]:
        c = model.config
        return {
            "the vocabulary size": c.vocab_size,
            "the MLP width (intermediate size)": c.intermediate_size if _hf(model) else c.d_ff,
        }

    def validate(self, model: nn.Module, tp: int) -> None:
        if _hf(model):
            check_transformers()
        n_heads, n_kv, _ = self.heads(model)
        HeadSplit(n_heads, n_kv, tp, 0)
        super().validate(model, tp)

    def shard_block(self, block: nn.Module, model: nn.Module, ctx: ShardContext) -> None:
        n_heads, n_kv, head_dim = self.heads(model)
        split = HeadSplit(n_heads, n_kv, ctx.tp, ctx.group.rank)
        attn, g = block.self_attn, ctx.group
        attn.q_proj = ColumnParallelLinear.from_linear(attn.q_proj, g, input_comm="none")
        for name in ("k_proj", "v_proj"):
            old = getattr(attn, name)
            if split.kv_replicated:
                new = HeadRowsLinear(old, g, split.kv_rows(head_dim))
            else:
                new = ColumnParallelLinear.from_linear(old, g, input_comm="none")
            setattr(attn, name, new)
        attn.o_proj = RowParallelLinear.from_linear(
            attn.o_proj, g, sequence_parallel=ctx.sequence_parallel
        )
        if _hf(model):
            attn.num_key_value_groups = split.local_heads // split.local_kv_heads
        else:
            attn.n_heads, attn.n_kv_heads = split.local_heads, split.local_kv_heads
        for norm in (getattr(attn, "q_norm", None), getattr(attn, "k_norm", None)):
            for p in norm.parameters() if norm is not None else ():
                add_grad_all_reduce(p, g)
                p.tp_grad_reduced = True
        self.region(attn, ctx)
        mlp = block.mlp
        mlp.gate_proj = ColumnParallelLinear.from_linear(mlp.gate_proj, g, input_comm="none")
        mlp.up_proj = ColumnParallelLinear.from_linear(mlp.up_proj, g, input_comm="none")
        mlp.down_proj = RowParallelLinear.from_linear(
            mlp.down_proj, g, sequence_parallel=ctx.sequence_parallel
        )
        self.region(mlp, ctx)
