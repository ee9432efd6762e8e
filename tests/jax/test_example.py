"""examples/jax trains its plain-JAX GPT with megalith.jax.adamw and offloaded_adamw, under
jax.jit, with the same losses as optax.adamw (a few CI-sized steps)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("jax")
pytest.importorskip("optax")

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "jax" / "train.py"


@pytest.fixture(scope="module")
def example():
    spec = importlib.util.spec_from_file_location("megalith_jax_example", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_losses_equal_optax(example):
    kw = dict(steps=6, d=16, layers=1, heads=2, seq=8, batch=4, lr=1e-2)
    ref = example.train("optax", **kw)
    ours = example.train("megalith", **kw)
    offloaded = example.train("offloaded", **kw)
    assert ref[-1] < ref[0]  # it learns
    np.testing.assert_allclose(ours, ref, rtol=2e-6)
    np.testing.assert_allclose(offloaded, ours, rtol=1e-6)


def test_cli_prints_the_three_runs(example, capsys):
    example.main(["--steps", "2", "--optimizer", "megalith"])
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["step", "megalith"] and len(lines) == 3
