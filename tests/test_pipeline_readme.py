"""The examples in packages/pipeline/README.md: the training script runs under torchrun
and learns; the simulator snippet prints a timeline and ZB-H1's bubble."""

from __future__ import annotations

import contextlib
import io
import re
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "packages" / "pipeline" / "README.md"


def _blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(), re.S)


@pytest.mark.timeout(180)
def test_readme_example_runs_under_torchrun(tmp_path):
    code = next(b for b in _blocks() if b.startswith("# example.py"))
    script = tmp_path / "example.py"
    script.write_text(code)
    result = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", str(script)],
        capture_output=True,
        text=True,
        timeout=170,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    first, last = map(float, re.search(r"loss ([0-9.]+) -> ([0-9.]+)", result.stdout).groups())
    assert last < first / 4, result.stdout
    assert "stages per rank (3, 2)" in result.stdout


def test_readme_simulator_snippet():
    code = next(b for b in _blocks() if "simulate(" in b and "example.py" not in b)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, "README", "exec"), {})
    text = out.getvalue()
    assert "rank 3 |" in text and text.strip().endswith("\n0.111")
