"""How the host step kernels split their elements over threads (core/src/optim/
cpu_schedule.cpp): the contiguous and the interleaved split give the same bits for
every optimizer and state format; without MEGALITH_CPU_SCHEDULE a process measures both
at its first large steps and keeps the faster; the variable forces one."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from megalith import _engine as e

N = (1 << 20) + 4099  # two tasks of 16 interleaved chunks, and a ragged end


def _adam(schedule: str, gen_seed: int, state_dtype: torch.dtype):
    os.environ["MEGALITH_CPU_SCHEDULE"] = schedule
    gen = torch.Generator().manual_seed(gen_seed)
    p = torch.randn(N, generator=gen)
    g = torch.randn(N, generator=gen).mul_(1e-2)
    m = torch.randn(N, generator=gen).mul_(1e-3).to(state_dtype)
    v = torch.rand(N, generator=gen).mul_(1e-5).to(state_dtype)
    copy = torch.empty(N, dtype=torch.bfloat16)
    hyper = e.AdamHyper(lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.01,
                        decoupled_weight_decay=True)  # fmt: skip
    for t in range(1, 4):
        e.adam_step_flat(p, g, m, v, None, copy, hyper=hyper, step=t, grad_scale=1.0,
                         nonfinite=e.NonFinite.detect)  # fmt: skip
    return p, m, v, copy


@pytest.mark.parametrize("state_dtype", [torch.float32, torch.bfloat16])
def test_both_splits_give_the_same_bits(gen, state_dtype):
    seed = int(torch.randint(0, 2**31, (1,), generator=gen))
    before = e.num_threads()
    e.set_num_threads(2)
    try:
        blocked = _adam("blocked", seed, state_dtype)
        interleaved = _adam("interleaved", seed, state_dtype)
    finally:
        os.environ.pop("MEGALITH_CPU_SCHEDULE", None)
        e.set_num_threads(before)
    for a, b in zip(blocked, interleaved):
        assert torch.equal(a, b)
    assert not torch.equal(blocked[0], torch.zeros(N))


PROBE = """
import torch
from megalith import _engine as e
e.set_num_threads(2)
n = 1 << 22
p, g, m, v = (torch.randn(n) for _ in range(4))
v.abs_()
h = e.AdamHyper(lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.0,
                decoupled_weight_decay=True)
seen = [e.cpu_step_schedule()]
for t in range(1, 12):
    e.adam_step_flat(p, g, m, v, None, None, hyper=h, step=t, grad_scale=1.0,
                     nonfinite=e.NonFinite.ignore)
    seen.append(e.cpu_step_schedule())
print(",".join(seen))
"""


@pytest.mark.parametrize("forced", [None, "blocked", "interleaved"])
def test_first_large_steps_measure_both_then_keep_one(forced):
    env = {k: v for k, v in os.environ.items() if k != "MEGALITH_CPU_SCHEDULE"}
    if forced:
        env["MEGALITH_CPU_SCHEDULE"] = forced
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True,
                         text=True, timeout=120, check=True).stdout.strip().split(",")  # fmt: skip
    if forced:
        assert set(out) == {forced}
        return
    # four timed passes of each split, then the faster for good
    assert out[:8] == ["measuring"] * 8, out
    assert out[8] in ("blocked", "interleaved") and set(out[8:]) == {out[8]}, out
