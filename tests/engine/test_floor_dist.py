"""The floor dist megalith-core: the roof's old names are the floor's very modules, and
the floor's own entry point finds the C++ files without the roof."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import megalith_core._engine

import megalith_core
import megalith_core.optim
import megalith_core.optim.adam


def test_old_names_are_the_floor_modules():
    import megalith.optim.adam

    import megalith._engine
    import megalith.optim
    from megalith.optim import HybridAdam

    assert megalith._engine is megalith_core._engine
    assert megalith.optim is megalith_core.optim
    assert megalith.optim.adam is megalith_core.optim.adam
    assert HybridAdam is megalith_core.optim.HybridAdam
    assert sys.modules["megalith.optim.functional"] is megalith_core.optim.functional


def test_floor_imports_nothing_above_it():
    # A fresh interpreter: importing the floor and stepping its optimizer loads no module of
    # the packages above it or of the roof.
    code = (
        "import sys, torch, megalith_core.optim as o\n"
        "p = torch.nn.Parameter(torch.randn(8))\n"
        "p.grad = torch.randn(8)\n"
        "o.CPUAdam([p]).step()\n"
        "above = sorted(m for m in sys.modules if m.split('.')[0] in "
        "{'megalith', 'megalith_comm', 'megalith_zero', 'megalith_offload', 'megalith_pipeline'})\n"
        "print(above)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert out.stdout.strip() == "[]", out.stdout


def test_floor_entry_point_names_its_cmake_dir():
    result = subprocess.run(
        [sys.executable, "-m", "megalith_core", "--cmake-dir"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    if result.returncode:  # an editable install has no installed C++ files: the error says so
        assert "not an installed build" in result.stderr, result.stderr
        return
    assert Path(result.stdout.strip(), "megalithConfig.cmake").is_file()
