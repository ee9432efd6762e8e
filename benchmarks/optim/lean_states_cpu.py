#!/usr/bin/env python3
"""Host AdamW step throughput per Adam state format, beside torch's fused AdamW.

usage: lean_states_cpu.py [LOG2N=25] [STEPS=7]

One flat fp32 parameter of 2^LOG2N elements with an fp32 gradient; the engine
step (megalith_core.optim.functional.adam_step, all engine threads) with
state_dtype fp32 / bf16 / int8 (and bf16 Kahan masters with bf16 states), then
torch.optim.AdamW(fused=True) on the same sizes, in one process. States start
from a real-looking (non-zero) point. Prints one markdown row per
configuration: median ms per step and Gparam/s (2^LOG2N / median).

Bytes per parameter read + written by one ideal pass (p, g, m, v):
  fp32 28, bf16 20 (m, v 2+2 each way), int8 ~16 (codes 1+1 each way + scales),
  bf16 Kahan master + bf16 states 16.
"""

from __future__ import annotations

import statistics
import sys
import time

import torch

from megalith_core import _engine
from megalith_core.optim import functional as F
from megalith_core.optim import lean_states

HP = dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)
BYTES = {"fp32": 28, "bf16": 20, "int8": 16, "bf16+kahan": 16, "torch fused": 28}


def engine_setup(fmt: str, n: int, gen: torch.Generator):
    p = torch.randn(n, generator=gen)
    g = torch.randn(n, generator=gen) * 1e-2
    m = torch.randn(n, generator=gen) * 1e-3
    v = torch.rand(n, generator=gen) * 1e-5
    state_dtype = "bf16" if fmt == "bf16+kahan" else fmt
    kw: dict = {}
    if state_dtype == "int8":
        q = lean_states.quantize(m, v)
        m, v = q["exp_avg"], q["exp_avg_sq"]
        kw = dict(exp_avg_scales=[q["exp_avg_scale"]], exp_avg_sq_scales=[q["exp_avg_sq_scale"]])
    elif state_dtype == "bf16":
        m, v = m.bfloat16(), v.bfloat16()
    if fmt == "bf16+kahan":
        hi = p.bfloat16()
        kw["param_comps"] = [(p - hi.float()).bfloat16()]
        p = hi
    t = [0]

    def step():
        t[0] += 1
        F.adam_step([p], [g], [m], [v], step=t[0], **HP, **kw)

    return step


def torch_setup(n: int, gen: torch.Generator):
    p = torch.nn.Parameter(torch.randn(n, generator=gen))
    p.grad = torch.randn(n, generator=gen) * 1e-2
    opt = torch.optim.AdamW([p], fused=True, **HP)
    opt.step()  # creates the states
    st = opt.state[p]
    st["exp_avg"].copy_(torch.randn(n, generator=gen) * 1e-3)
    st["exp_avg_sq"].copy_(torch.rand(n, generator=gen) * 1e-5)
    return opt.step


def time_steps(step, steps: int) -> float:
    step()
    step()  # warm-up: pages touched, threads awake
    ms = []
    for _ in range(steps):
        t0 = time.perf_counter()
        step()
        ms.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(ms)


def main() -> None:
    log2n = int(sys.argv[1]) if len(sys.argv) > 1 else 25
    steps = int(sys.argv[2]) if len(sys.argv) > 2 else 7
    n = 1 << log2n
    gen = torch.Generator().manual_seed(0)
    print(
        f"n = 2^{log2n}, engine threads {_engine.num_threads()}, torch threads "
        f"{torch.get_num_threads()}, SIMD {_engine.simd_level()}, torch {torch.__version__}\n"
    )
    print("| configuration | B/param | ms/step (median) | Gparam/s | vs torch fused |")
    print("|---|---|---|---|---|")
    rows = []
    for fmt in ("fp32", "bf16", "int8", "bf16+kahan"):
        rows.append((fmt, time_steps(engine_setup(fmt, n, gen), steps)))
    rows.append(("torch fused", time_steps(torch_setup(n, gen), steps)))
    ref = rows[-1][1]
    for name, ms in rows:
        label = name if name == "torch fused" else f"megalith state_dtype={name}"
        print(f"| {label} | {BYTES[name]} | {ms:.1f} | {n / ms / 1e6:.3f} | {ref / ms:.2f}x |")


if __name__ == "__main__":
    main()
