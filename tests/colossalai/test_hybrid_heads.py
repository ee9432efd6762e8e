"""Issue 17, bug 4d: HybridParallelPlugin splits transformers' task heads, not only causal
LMs. For every head ColossalAI's shardformer covers in the GPT-2, Llama, BERT and T5
families, tp 2 and pp 2 on CPU ranks give the plain single-process model's loss and
gradients (fp32, 1e-5 relative), and execute_pipeline's outputs are the model's own type.
All settings run in one spawned process group of 2 ranks."""

from __future__ import annotations

import pytest

from megalith.testing import run_grid
from tests.colossalai.hybrid_workers import HEADS, heads_grid

SETTINGS = [
    (name, tp, pp) for names in HEADS.values() for name in names for tp, pp in ((2, 1), (1, 2))
]


@pytest.mark.timeout(200)
def test_every_head_matches_the_plain_model_under_tp2_and_pp2():
    results = run_grid(heads_grid, SETTINGS, 2, timeout=180)
    failures = [e for per_rank in results for errors in per_rank for e in errors]
    first: dict[str, str] = {}
    for e in failures:
        first.setdefault(" ".join(e.split()[:3]), e)
    assert not failures, "\n".join(first.values())
