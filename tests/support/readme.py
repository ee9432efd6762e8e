"""Runs a package README's `# example.py` block under torchrun (used by the README tests)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def readme(package: str) -> Path:
    return ROOT / "packages" / package / "README.md"


def run_example(package: str, tmp_path: Path, nproc: int = 2, timeout: float = 170) -> str:
    """Writes the example to tmp_path/example.py, runs it on nproc ranks in tmp_path,
    and returns its stdout; a non-zero exit fails with the output's tail."""
    blocks = re.findall(r"```python\n(.*?)```", readme(package).read_text(), re.S)
    script = tmp_path / "example.py"
    script.write_text(next(b for b in blocks if b.startswith("# example.py")))
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc_per_node",
            str(nproc),
            str(script),
        ],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    return result.stdout
