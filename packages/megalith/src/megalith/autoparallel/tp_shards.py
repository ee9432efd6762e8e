"""What a family's tensor-parallel policy shards, learned by running the policy itself on
a meta copy of the model, so the analysis never repeats a policy's choices by hand.

The copy is sharded over a one-rank stand-in group: every size divides 1, nothing is
communicated, and each sharded parameter comes back carrying its `tp_spec`. The
row-parallel linears (and a vocabulary-parallel embedding) are the modules whose
forward output is all-reduced under tp.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from types import SimpleNamespace

from torch import nn


@dataclass(frozen=True)
class TPLayout:
    policy: str | None  # the policy's name, None when no policy matches
    sharded: frozenset[str] = field(default_factory=frozenset)  # parameter names
    all_reduced: frozenset[str] = field(default_factory=frozenset)  # module paths


def _one_rank_group() -> SimpleNamespace:
    return SimpleNamespace(size=1, rank=0, ranks=(0,), name="autoparallel-analysis")


def tp_layout(model: nn.Module) -> TPLayout:
    """The policy's sharding of `model` (a meta model; it is not changed)."""
    from megalith.tensor_parallel.embedding import VocabParallelEmbedding
    from megalith.tensor_parallel.linear import RowParallelLinear
    from megalith.tensor_parallel.policies import policy_for
    from megalith.tensor_parallel.policies.base import ShardContext

    try:
        policy = policy_for(model)
    except ValueError:
        return TPLayout(None)
    shadow = copy.deepcopy(model)
    policy.shard(shadow, ShardContext(_one_rank_group()))
    sharded = frozenset(
        name for name, p in shadow.named_parameters(remove_duplicate=False) if hasattr(p, "tp_spec")
    )
    reduced = frozenset(
        path
        for path, m in shadow.named_modules(remove_duplicate=False)
        if isinstance(m, RowParallelLinear | VocabParallelEmbedding)
    )
    return TPLayout(policy.name, sharded, reduced)
