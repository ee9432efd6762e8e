"""The examples in packages/pipeline/README.md: the training script runs under torchrun
and learns; the simulator snippet prints a timeline and ZB-H1's bubble."""

from __future__ import annotations

import contextlib
import io
import re

import pytest

from tests.support.readme import readme, run_example

README = readme("pipeline")


def _blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(), re.S)


@pytest.mark.timeout(180)
def test_readme_example_runs_under_torchrun(tmp_path):
    out = run_example("pipeline", tmp_path)
    first, last = map(float, re.search(r"loss ([0-9.]+) -> ([0-9.]+)", out).groups())
    assert last < first / 4, out
    assert "stages per rank (3, 2)" in out


def test_readme_simulator_snippet():
    code = next(b for b in _blocks() if "simulate(" in b and "example.py" not in b)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, "README", "exec"), {})
    text = out.getvalue()
    assert "rank 3 |" in text and text.strip().endswith("\n0.111")
