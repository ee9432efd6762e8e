"""`megalith train --optim-state-dtype`: adamw's lean states reach the HybridAdam the loop
builds, and the combinations that cannot keep them fail before any rank starts, naming
the fix (the loss parity of the formats: benchmarks/results/optim_cpu/
2026-12-03_cpu2_lean_state_parity.md)."""

from __future__ import annotations

import argparse

import pytest
import torch

from megalith.train import choices
from megalith.train.options import add_options


def _args(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_options(p)
    return p.parse_args(list(argv))


@pytest.mark.parametrize("dtype", ["fp32", "bf16", "int8"])
def test_the_optimizer_keeps_the_chosen_states(dtype):
    args = _args("--optim-state-dtype", dtype)
    choices.check(args)
    p = torch.nn.Parameter(torch.randn(300))
    opt = choices.make_optimizer(args, [{"params": [p]}])
    p.grad = torch.randn(300)
    opt.step()
    assert opt.param_groups[0]["state_dtype"] == dtype
    want = {"fp32": torch.float32, "bf16": torch.bfloat16, "int8": torch.int8}[dtype]
    assert opt.state[p]["exp_avg"].dtype == want


@pytest.mark.parametrize(
    ("argv", "fix"),
    [
        (("--optimizer", "lion"), "use --optimizer adamw, or --optim-state-dtype fp32"),
        (("--plugin", "auto"), "kept by --plugin ddp, zero1, zero2 and gemini"),
    ],
)
def test_what_cannot_keep_lean_states_names_the_fix(argv, fix):
    with pytest.raises(ValueError, match=fix.replace("(", r"\(").replace(")", r"\)")):
        choices.check(_args("--optim-state-dtype", "int8", *argv))


@pytest.mark.parametrize("plugin", ["zero1", "zero2", "gemini"])
def test_zero_plugins_take_lean_states(plugin):
    """ZeRO's chunks keep the optimizer's format (tests/zero/test_lean_chunk_states.py)."""
    choices.check(_args("--optim-state-dtype", "int8", "--plugin", plugin))
    choices.check(_args("--optim-state-dtype", "bf16", "--plugin", plugin, "--offload", "host"))
