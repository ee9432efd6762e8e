"""HybridAdam(state_dtype="bf16"/"int8") given to the ZeRO plugins keeps its lean states
in the chunks (tests/zero/test_lean_chunk_states.py has the chunk step itself); the
Booster's checkpoints (layout-free fp32 files, the format in optimizer.json) resume."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

from megalith.booster import Booster, GeminiPlugin, LowLevelZeroPlugin
from megalith.optim import HybridAdam
from megalith.testing import run_grid

from ..zero import toy
from .toy_loop import train_toy


@dataclass(frozen=True)
class LeanRun:
    plugin: str  # "zero2", "zero2_offload" or "gemini"
    state_dtype: str
    steps: int = 8
    save_at: int = 0
    save_dir: str = ""
    resume: str = ""


def train(rank: int, run: LeanRun):
    model = toy.make_model(5)
    opt = HybridAdam(toy.param_groups(model, 0.1), lr=1e-2, state_dtype=run.state_dtype)
    if run.plugin == "gemini":
        plugin = GeminiPlugin(precision="fp32")
    else:
        plugin = LowLevelZeroPlugin(
            stage=2, precision="fp32", cpu_offload=run.plugin == "zero2_offload"
        )
    booster = Booster(plugin=plugin)
    model, opt, *_ = booster.boost(model, opt)
    losses = train_toy(rank, booster, model, opt, run)
    dtypes = {t.dtype for c in opt.zero_optimizer.chunks if c.trainable for t in c.states.values()}
    _check_state_views(opt)
    opt.zero_optimizer.close()
    return (losses, dtypes) if rank == 0 else None


def _check_state_views(opt) -> None:
    """opt.state (the torch-facing view) holds each parameter's piece of the chunk
    states: decoded, it is the chunk's own fp32 values there (int8 pieces carry their
    block scales, or are decoded copies when they cut a block)."""
    from megalith.booster.plugin.zero_optimizers import state_pieces
    from megalith_core.optim import flat_states, lean_states

    state = opt.state
    checked = 0
    for c in opt.zero_optimizer.chunks:
        if not c.trainable or not c.states or c.tier == "nvme":
            continue
        want = flat_states.to_fp32(c.states)
        for i, lo, hi in state_pieces(c):
            entry = {k: v for k, v in state[c.params[i]].items() if k != "step"}
            m, v = lean_states.to_fp32(entry)
            assert torch.equal(m, want["exp_avg"][lo:hi]), (c.spec.index, i)
            assert torch.equal(v, want["exp_avg_sq"][lo:hi]), (c.spec.index, i)
            checked += 1
    assert checked


@pytest.mark.parametrize("state_dtype", ["bf16", "int8"])
def test_zero_plugins_keep_lean_states_and_resume(state_dtype, tmp_path):
    runs, resumed = [], []
    for plugin in ("zero2", "zero2_offload", "gemini"):
        d = str(tmp_path / plugin)
        runs.append(LeanRun(plugin, state_dtype, save_at=4, save_dir=d))
        resumed.append(LeanRun(plugin, state_dtype, save_at=4, resume=d))
    first = run_grid(train, runs, 2, timeout=240)
    again = run_grid(train, resumed, 2, timeout=240)
    want = {"bf16": {torch.bfloat16}, "int8": {torch.int8, torch.uint8, torch.float32}}
    for run, a, b in zip(runs, first, again):
        (la, dtypes), (lb, _) = a[0], b[0]
        assert dtypes == want[state_dtype], f"{run}: chunk states {dtypes}"
        if state_dtype == "bf16":  # fp32 values of bf16 states round-trip exactly
            assert la[4:] == lb, f"{run}: resumed losses differ"
        else:  # q8 codes re-encoded from their decoded values: within the rule's bits
            assert max(abs(x - y) / x for x, y in zip(la[4:], lb)) < 1e-4, run
