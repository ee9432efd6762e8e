"""The example in packages/zero/README.md runs under torchrun, learns, and writes its checkpoint."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "packages" / "zero" / "README.md"


@pytest.mark.timeout(180)
def test_readme_example_runs_under_torchrun(tmp_path):
    code = re.search(r"```python\n(# example\.py.*?)```", README.read_text(), re.S).group(1)
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
    assert (tmp_path / "ckpt" / "zero_meta.json").exists()
    assert (tmp_path / "ckpt" / "rank00001.safetensors").exists()
