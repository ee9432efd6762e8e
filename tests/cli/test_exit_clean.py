"""Issue 21 item 9: short `megalith train` runs end with rc 0 every time, never an abort at
exit ("terminate called without an active exception", rc 134). The soak of hundreds of
runs is tools/exit_stress.py; this is its CI-sized form."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RUNS = 3


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_short_train_runs_exit_cleanly():
    proc = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "exit_stress.py"), "--runs", str(RUNS),
         "--steps", "2", "--timeout", "70"],
        capture_output=True, text=True, timeout=230,
    )  # fmt: skip
    text = proc.stdout + proc.stderr
    assert f"exit stress: {RUNS} runs, 0 aborts (rc 134 or terminate), 0 other failures" in text
    assert proc.returncode == 0, text[-3000:]
