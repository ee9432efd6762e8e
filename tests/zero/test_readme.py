"""The example in packages/zero/README.md runs under torchrun, learns, and writes its checkpoint."""

from __future__ import annotations

import re

import pytest

from tests.support.readme import run_example


@pytest.mark.timeout(180)
def test_readme_example_runs_under_torchrun(tmp_path):
    out = run_example("zero", tmp_path)
    first, last = map(float, re.search(r"loss ([0-9.]+) -> ([0-9.]+)", out).groups())
    assert last < first / 4, out
    assert (tmp_path / "ckpt" / "zero_meta.json").exists()
    assert (tmp_path / "ckpt" / "rank00001.safetensors").exists()
