"""tools/line_budget.py: passes on the repository, and fails on a file over the limit."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "tools" / "line_budget.py"


def run_budget(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=60
    )


def test_repository_is_within_budget():
    result = run_budget()
    assert result.returncode == 0, result.stdout + result.stderr
    assert "line budget ok" in result.stdout


def write_lines(path: Path, count: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("x = 1\n" * count)


def test_over_limit_fails_and_names_the_file(tmp_path):
    write_lines(tmp_path / "core" / "src" / "big.cpp", 801)
    write_lines(tmp_path / "python" / "megalith" / "ok.py", 800)
    write_lines(tmp_path / "tests" / "huge_test.py", 2000)  # listed, not enforced
    write_lines(tmp_path / "core" / "notes.md", 5000)  # not a source file
    write_lines(tmp_path / "build" / "generated.cpp", 5000)  # build output

    result = run_budget("--root", str(tmp_path))
    assert result.returncode == 1, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert any("core/src/big.cpp" in line and "OVER LIMIT" in line for line in lines)
    assert any("python/megalith/ok.py" in line and "OVER LIMIT" not in line for line in lines)
    assert any("tests/huge_test.py" in line and "OVER LIMIT" not in line for line in lines)
    assert "notes.md" not in result.stdout
    assert "generated.cpp" not in result.stdout


def test_only_warnings_pass(tmp_path):
    write_lines(tmp_path / "packages" / "zero" / "src" / "megalith_zero" / "stage3.py", 700)
    write_lines(tmp_path / "core" / "src" / "small.cpp", 100)
    result = run_budget("--root", str(tmp_path))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "stage3.py" in result.stdout
    assert "small.cpp" not in result.stdout
