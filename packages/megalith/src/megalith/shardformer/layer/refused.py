"""The names of ColossalAI's shardformer.layer that megalith does not provide, each with
what to use instead (module __getattr__ raises it, so the import names the fix)."""

from __future__ import annotations


def refused_names() -> dict[str, str]:
    policy = "boost the model with HybridParallelPlugin(tp_size=...), whose policies place it"
    return {
        "FusedLinear1D_Col": f"fused q|k|v nn.Linear layers: {policy}",
        "FusedLinear1D_Row": policy,
        "FusedLinear": policy,
        "GPT2FusedLinearConv": policy,
        "PaddingEmbedding": "use VocabParallelEmbedding1D (it pads the vocabulary too)",
        "PaddingLMHead": policy,
        "VocabParallelLMHead1D": policy,
        "ColoAttention": "use torch.nn.functional.scaled_dot_product_attention",
        "RingAttention": 'use HybridParallelPlugin(sequence_parallelism_mode="all_to_all")',
        "AttnMaskType": "use torch.nn.functional.scaled_dot_product_attention",
        "get_pad_info": "use torch.nn.functional.scaled_dot_product_attention",
        "all_to_all_comm": "use megalith_comm.all_to_all",
        "cross_entropy_1d": "use megalith.tensor_parallel.vocab_parallel_cross_entropy",
        "dist_cross_entropy": "use megalith.tensor_parallel.vocab_parallel_causal_lm_loss",
        "dist_log_prob": "gather the logits and use torch.log_softmax",
        "dist_log_prob_1d": "gather the logits and use torch.log_softmax",
    }
