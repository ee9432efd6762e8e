"""The causal-LM loss of a model whose logits stay vocabulary-parallel.

With HybridParallelPlugin(parallel_output=True) (ColossalAI's default) a causal LM's
lm_head keeps each rank's slice of the vocabulary: the logits are never gathered, and the
loss is computed on the slices (vocab_parallel_causal_lm_loss: the same shifted, -100
ignoring mean as transformers' and megalith.models' own). install_parallel_loss wraps
the model's forward so that `model(..., labels=...)` still returns the model's own output
type with the right .loss, and logits of [..., vocab / tp].
"""

from __future__ import annotations

import functools
from typing import Any

from torch import nn

from ..cross_entropy import vocab_parallel_causal_lm_loss


def install_parallel_loss(model: nn.Module, group: Any) -> None:
    """model.forward computes its loss on vocabulary-parallel logits over group."""
    inner = model.forward
    hf = type(model).__module__.startswith("transformers.")

    @functools.wraps(inner)
    def forward(*args: Any, **kwargs: Any) -> Any:
        labels = kwargs.pop("labels", None)
        if labels is None and not hf and len(args) > 1:
            labels, args = args[1], args[:1]
        out = inner(*args, **kwargs)
        if labels is None:
            return out
        if hf:
            loss = vocab_parallel_causal_lm_loss(out.logits, labels, group)
            fields = {k: v for k, v in out.items() if k != "loss"}
            return type(out)(loss=loss, **fields)
        from megalith.models import CausalLMOutput

        return CausalLMOutput(vocab_parallel_causal_lm_loss(out, labels, group), out)

    model.forward = forward
    model.parallel_output_group = group
