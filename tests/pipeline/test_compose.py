"""pp 2 x dp 2 on four CPU ranks: the pipeline with data parallelism (gradients averaged over
dp by the pipeline) and with megalith_zero's stage 1 over the mesh's dp axis (reduced once
per step by ZeRO, every backward but the last inside its no_sync), against the whole model
on the whole batch: losses, gradients, weights after two steps within 1e-5."""

from __future__ import annotations

import pytest

from megalith.testing import run_grid
from tests.pipeline.compose import Compose, check_composed

CASES = [
    Compose("1f1b", "gpt2", zero=False),  # tied head: summed over pp, then averaged over dp
    Compose("interleaved", "mixed", zero=False),
    Compose("zb-h1", "mlp", zero=False),
    Compose("1f1b", "mlp", zero=True),
    Compose("zb-h1", "mixed", zero=True),
    Compose("interleaved", "mlp", zero=True),
    Compose("zb-v", "gpt2", zero=False),  # tied head: first and last stage both on pp rank 0
    Compose("zb-v", "mixed", zero=True),
]


@pytest.mark.timeout(200)
def test_data_parallel_and_zero_stage1_over_dp():
    results = run_grid(check_composed, CASES, 4, timeout=180)
    for case, ranks in zip(CASES, results):
        assert max(r["worst"] for r in ranks) <= 1e-5, case
