"""Mixture-of-experts: expert parallelism for transformers' MoE models (experts.py),
used by MoeHybridParallelPlugin(ep_size=...)."""

from .experts import (
    ExpertParallelExperts,
    apply_expert_parallel,
    experts_modules,
    is_expert_param,
    validate_experts,
)

__all__ = [
    "ExpertParallelExperts",
    "apply_expert_parallel",
    "experts_modules",
    "is_expert_param",
    "validate_experts",
]
