"""The example in packages/comm/README.md runs under torchrun and prints what it says."""

from __future__ import annotations

import pytest

from tests.support.readme import run_example


@pytest.mark.timeout(120)
def test_readme_example_runs_under_torchrun(tmp_path):
    out = run_example("comm", tmp_path, timeout=100)
    # the two ranks print concurrently: lines may interleave, so look for each one
    for line in (
        "rank 0 {'dp': 0, 'tp': 0}: grad [0.5, 0.5, 0.5, 0.5, 0.5] shard [0.0, 2.0, 4.0]",
        "rank 1 {'dp': 1, 'tp': 0}: grad [0.5, 0.5, 0.5, 0.5, 0.5] shard [6.0, 8.0, 10.0]",
    ):
        assert line in out, out
