"""Bad Booster configuration fails at once, with the fix in the message, and library code
has no bare asserts (which `python -O` would strip)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch

from megalith.booster import Booster, GeminiPlugin, LowLevelZeroPlugin

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("make", "error", "message"),
    [
        (lambda: Booster(plugin="zero9"), ValueError, "unknown plugin 'zero9'; expected one of"),
        (lambda: Booster(plugin=42), TypeError, "plugin must be a megalith Plugin or a name"),
        (lambda: LowLevelZeroPlugin(stage=3), ValueError, "stage 3 is GeminiPlugin"),
        (
            lambda: GeminiPlugin(placement_policy="auto", offload_optim_frac=0.5),
            ValueError,
            "auto placement decides the fraction itself",
        ),
        (
            lambda: GeminiPlugin(placement_policy="auto", steady_cuda_cap_ratio=1.5),
            ValueError,
            "steady_cuda_cap_ratio=1.5",
        ),
        (
            lambda: GeminiPlugin(offload_param_frac=0.5),
            ValueError,
            "raise offload_optim_frac to at least offload_param_frac",
        ),
        (
            lambda: GeminiPlugin(placement_policy="auto", offload_param_frac=0.5),
            ValueError,
            "use placement_policy='static' to choose it",
        ),
        (lambda: GeminiPlugin(offload_optim_frac=1.5), ValueError, "optim_frac=1.5; expected 0 <="),
        (
            lambda: LowLevelZeroPlugin(precision="fp8"),
            ValueError,
            "expected one of fp32, fp16, bf16",
        ),
        (lambda: Booster(mixed_precision="int4"), ValueError, "expected one of fp32, fp16, bf16"),
    ],
)
def test_bad_configuration_names_the_fix(make, error, message):
    with pytest.raises(error, match=message.replace("(", r"\(").replace(")", r"\)")):
        make()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU message")
def test_gpu_device_without_gpu():
    with pytest.raises(RuntimeError, match="no CUDA GPU is visible here"):
        Booster(device="cuda")


def test_library_code_has_no_bare_asserts():
    found = []
    roots = [ROOT / "python" / "megalith_core", *sorted((ROOT / "packages").glob("*/src"))]
    for root in roots:
        for path in root.rglob("*.py"):
            if "testing" in path.parts:
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Assert):
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not found, "checks must raise (python -O strips asserts):\n  " + "\n  ".join(found)


def test_gemini_auto_placement_is_megalith_offloads_auto():
    # ColossalAI's placement_policy="auto": every state offloaded for a warm-up step,
    # then as many chunks as fit steady_cuda_cap_ratio of the device come back
    # (trained end to end in tests/test_offload_auto.py).
    plugin = GeminiPlugin(placement_policy="auto", steady_cuda_cap_ratio=0.8)
    config = plugin._offload
    assert (config.placement, config.tier, config.optim_frac) == ("auto", "host", 1.0)
    assert abs(config.headroom - 0.2) < 1e-12
