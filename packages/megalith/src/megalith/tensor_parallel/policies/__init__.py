"""Policies that shard a model in place for tensor (and sequence) parallelism.

    shard_model(model, group)                      # picks the policy by model class
    shard_model(model, group, policy=MyPolicy())   # any other model

Supported: megalith.models GPTLMHeadModel and LlamaForCausalLM; transformers' GPT-2
models (GPT2Model, GPT2LMHeadModel, GPT2DoubleHeadsModel, GPT2For{Sequence,Token}
Classification, GPT2ForQuestionAnswering), Llama / Mistral / Qwen2 / Qwen3 (*Model,
*ForCausalLM, *ForSequenceClassification), BertModel and its Bert* heads (bert.py),
T5ForConditionalGeneration, T5EncoderModel and the other T5* models (t5.py). Not yet: MoE.

A policy also cuts its models into pipeline stages (Policy.pipeline_parts,
<family>_stages.py): every model above, except T5's sequence-classification and
question-answering heads (T5Model, T5ForConditionalGeneration, T5EncoderModel and
T5ForTokenClassification are cut).
"""

from __future__ import annotations

from torch import nn

from megalith_comm import ProcessGroup

from .base import DecoderPolicy, Policy, ShardContext, TPInfo
from .bert import BertPolicy
from .gpt2 import GPT2Policy, ParallelGPTAttention
from .llama import LlamaPolicy
from .parallel_loss import install_parallel_loss
from .t5 import T5Policy

POLICIES: list[Policy] = [GPT2Policy(), LlamaPolicy(), BertPolicy(), T5Policy()]

SUPPORTED = (
    "megalith.models.GPTLMHeadModel, megalith.models.LlamaForCausalLM, transformers "
    "GPT2Model, GPT2LMHeadModel, GPT2DoubleHeadsModel, GPT2ForSequenceClassification, "
    "GPT2ForTokenClassification, GPT2ForQuestionAnswering, LlamaModel, LlamaForCausalLM, "
    "LlamaForSequenceClassification (and the Mistral, Qwen2, Qwen3 ones), "
    "BertModel, BertForMaskedLM, BertForSequenceClassification (and the other Bert* heads), "
    "T5ForConditionalGeneration, T5EncoderModel (and the other T5* models)"
)


def policy_for(model: nn.Module) -> Policy:
    for policy in POLICIES:
        if policy.matches(model):
            return policy
    raise ValueError(
        f"no tensor-parallel policy for {type(model).__module__}.{type(model).__name__}; "
        f"supported: {SUPPORTED}. For other models pass policy= (a "
        "megalith.tensor_parallel.Policy subclass)"
    )


def shard_model(
    model: nn.Module,
    group: ProcessGroup,
    *,
    sequence_parallel: bool = False,
    gather_logits: bool = True,
    policy: Policy | None = None,
) -> nn.Module:
    """Shards model in place over group (no collective runs here) and returns it.

    Every size is checked against group.size first, so a bad tp fails on every
    rank with the numbers before the model is touched.
    """
    if hasattr(model, "tp_info"):
        raise ValueError("this model is already tensor-parallel (model.tp_info is set)")
    policy = policy or policy_for(model)
    policy.validate(model, group.size)
    ctx = ShardContext(group, sequence_parallel, gather_logits)
    policy.shard(model, ctx)
    model.tp_info = TPInfo(group, sequence_parallel, gather_logits, policy.name)
    return model


__all__ = [
    "POLICIES",
    "SUPPORTED",
    "BertPolicy",
    "DecoderPolicy",
    "GPT2Policy",
    "LlamaPolicy",
    "ParallelGPTAttention",
    "Policy",
    "ShardContext",
    "T5Policy",
    "TPInfo",
    "install_parallel_loss",
    "policy_for",
    "shard_model",
]
