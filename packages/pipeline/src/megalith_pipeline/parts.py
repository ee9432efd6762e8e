"""From a model to the list of layers a pipeline cuts: the PipelineParts protocol.

A pipeline needs the model as consecutive layers, each taking the previous one's
output. Accepted:

- an nn.Sequential, an nn.ModuleList, or a list of modules;
- PipelineParts(embed, blocks, head): an embedding module (model input ->
  hidden states), the transformer blocks (hidden -> hidden) and a head (hidden
  -> what the loss function takes). This is how language models come in;
- any model with a `pipeline_parts()` method returning PipelineParts (or a list of
  layers): the way a model says how it splits. The project's reference models
  can implement it; it wins over the layouts below;
- a model laid out like transformers' GPT2LMHeadModel (`transformer.wte`, `.wpe`,
  `.drop`, `.h`, `.ln_f`, `lm_head`) or LlamaForCausalLM (`model.embed_tokens`,
  `.layers`, `.norm`, `.rotary_emb`, `lm_head`), adapted by gpt2_parts and
  llama_parts (adapters.py). They take input ids (batch, seq), causal attention
  without padding masks, and return logits.

Parameters shared between layers (a head tied to the embedding) stay shared: the
pipeline sums their gradients over the stages that hold them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from torch import nn


@dataclass
class PipelineParts:
    """An embedding, a list of blocks and a head: layers [embed, *blocks, head]."""

    embed: nn.Module
    blocks: Sequence[nn.Module]
    head: nn.Module

    def layers(self) -> list[nn.Module]:
        return [self.embed, *self.blocks, self.head]
