"""ZeroConfig(step_in_backward=True): chunks are updated while backward goes on.

test_offload_zero.py checks the trained values against ZeRO without offload; here: the
updates really start inside backward, gradient accumulation under no_sync() gives the
step of the summed gradients, and what the mode cannot do fails with the fix named
(clipping, fp16 loss scaling, a second backward or zero_grad() before step()), and
parameter offloading below stage 3.
"""

from __future__ import annotations

import pytest
import torch

import megalith_comm as comm
import megalith_zero as zero
from megalith.testing import run_distributed
from megalith_offload import OffloadConfig
from tests.zero import toy


def _shard(eager: bool, precision: str = "fp32", param_frac: float = 0.0, offload: bool = True):
    model = toy.make_model(0)
    opt = torch.optim.AdamW(toy.param_groups(model, 0.1), lr=1e-2)
    config = zero.ZeroConfig(
        stage=2,
        precision=precision,
        chunk_bytes=2048,
        offload=OffloadConfig(tier="host", param_frac=param_frac) if offload else None,
        step_in_backward=eager,
    )
    return zero.shard(model, opt, config)


def _accumulate(rank: int, eager: bool, offload: bool = True) -> dict:
    """Two micro-batches per step (the first inside no_sync) for 4 steps."""
    n = comm.get_world().world_size
    zmodel, zopt = _shard(eager, offload=offload)
    rows = toy.BATCH // n
    early = []
    for micro in toy.batches(1, 4, 2):
        for i, (x, y) in enumerate(micro):
            mine = slice(rank * rows, (rank + 1) * rows)
            loss = toy.loss_fn(zmodel, x[mine], y[mine]) / 2
            if i == 0:
                with zopt.no_sync():
                    zopt.backward(loss)
                early.append(len(zopt._stepped_early))  # nothing reduced yet: nothing stepped
            else:
                zopt.backward(loss)
                early.append(len(zopt._stepped_early))
        zopt.step()
        zopt.zero_grad()
    state = zmodel.full_state_dict()
    zopt.close()
    return {"early": early, "params": state, "chunks": sum(c.trainable for c in zmodel.chunks)}


@pytest.mark.parametrize("offload", [True, False], ids=["host", "device"])
def test_accumulated_steps_match_and_start_in_backward(offload):
    eager, plain = (run_distributed(_accumulate, 2, e, offload, timeout=180) for e in (True, False))
    for r in eager:
        assert r["early"][0::2] == [0] * 4, r["early"]
        assert all(0 < k <= r["chunks"] for k in r["early"][1::2]), r["early"]
    assert all(k == 0 for k in plain[0]["early"])
    for name, ref in plain[0]["params"].items():
        assert torch.equal(eager[0]["params"][name], ref), name


def _misuse(rank: int) -> dict:
    out = {}
    try:
        _shard(True, precision="fp16")
    except ValueError as e:
        out["fp16"] = str(e)
    try:
        _shard(False, param_frac=0.5)
    except ValueError as e:
        out["param_frac"] = str(e)
    zmodel, zopt = _shard(True)
    x, y = toy.batches(2, 1, 1)[0][0]
    zopt.backward(toy.loss_fn(zmodel, x, y))
    for name, call in (("clip", lambda: zopt.clip_grad_norm_(1.0)), ("zero_grad", zopt.zero_grad)):
        try:
            call()
        except RuntimeError as e:
            out[name] = str(e)
    try:
        zopt.backward(toy.loss_fn(zmodel, x, y))
    except RuntimeError as e:
        out["second"] = str(e)
    zopt.close()
    return out


@pytest.mark.parametrize("world_size", [1, 2])
def test_misuse_names_the_fix(world_size):
    for r in run_distributed(_misuse, world_size, timeout=120):
        assert "train in bf16, or set step_in_backward=False" in r["fp16"]
        assert "use stage=3 or param_frac=0" in r["param_frac"]
        assert "set step_in_backward=False to clip" in r["clip"]
        assert "call step() first" in r["zero_grad"]
        assert "accumulate gradients inside ZeroOptimizer.no_sync()" in r["second"]
