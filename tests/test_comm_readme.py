"""The example in packages/comm/README.md runs under torchrun and prints what it says."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "packages" / "comm" / "README.md"


@pytest.mark.timeout(120)
def test_readme_example_runs_under_torchrun(tmp_path):
    code = re.search(r"```python\n(# example\.py.*?)```", README.read_text(), re.S).group(1)
    script = tmp_path / "example.py"
    script.write_text(code)
    result = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", str(script)],
        capture_output=True,
        text=True,
        timeout=100,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    # the two ranks print concurrently: lines may interleave, so look for each one
    for line in (
        "rank 0 {'dp': 0, 'tp': 0}: grad [0.5, 0.5, 0.5, 0.5, 0.5] shard [0.0, 2.0, 4.0]",
        "rank 1 {'dp': 1, 'tp': 0}: grad [0.5, 0.5, 0.5, 0.5, 0.5] shard [6.0, 8.0, 10.0]",
    ):
        assert line in result.stdout, result.stdout
