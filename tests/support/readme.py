"""Runs a package README's `# example.py` block under torchrun (used by the README tests)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def readme(package: str) -> Path:
    return ROOT / "packages" / package / "README.md"


# Prepended to an example so that its ranks cannot import the named top-level modules,
# as where those dists are not installed.
_HIDE = """import importlib.abc as _abc, sys as _sys
class _Hidden(_abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {hidden!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}} (hidden by the test)")
_sys.meta_path.insert(0, _Hidden())
"""


def run_example(
    package: str,
    tmp_path: Path,
    nproc: int = 2,
    timeout: float = 170,
    without: tuple[str, ...] = ("megalith",),
) -> str:
    """Writes the example to tmp_path/example.py, runs it on nproc ranks in tmp_path,
    and returns its stdout; a non-zero exit fails with the output's tail.

    `without`: top-level modules the ranks cannot import. By default the roof dist
    `megalith` (Booster, CLI): a package's example must run with the package and
    the floor alone."""
    blocks = re.findall(r"```python\n(.*?)```", readme(package).read_text(), re.S)
    script = tmp_path / "example.py"
    example = next(b for b in blocks if b.startswith("# example.py"))
    script.write_text((_HIDE.format(hidden=set(without)) if without else "") + example)
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
