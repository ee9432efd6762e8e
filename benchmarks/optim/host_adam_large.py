"""AdamW over ~1e9 fp32 params on a many-core host: megalith's CPU kernel beside
torch.optim.AdamW(fused=True), measured in the same run (issue 2's target on the
H200 machine's 16-core host: >= 5.0 Gparam/s; DeepSpeed's CPU Adam: 4.66).

usage: python benchmarks/optim/host_adam_large.py [--n 1e9] [--threads 16] [--steps 5] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time

import torch

from megalith import _engine
from megalith.optim import functional as F


def timed(fn, steps: int) -> list[float]:
    fn()  # warm-up (first touch of any lazily-allocated pages)
    out = []
    for _ in range(steps):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def thp_mode() -> str:
    """The kernel's transparent huge page policy ("always", "madvise" or "never")."""
    try:
        text = open("/sys/kernel/mm/transparent_hugepage/enabled").read()
    except OSError:
        return "unknown"
    return text[text.index("[") + 1 : text.index("]")] if "[" in text else text.strip()


def engine_host_tensor(n: int) -> torch.Tensor:
    """n float32 values in the engine's pageable host memory (HostResource: blocks of 2 MiB
    and more are 2 MiB aligned and advised for transparent huge pages, so one TLB entry
    covers 512 times the memory, which a 28 GB stream needs)."""
    buf = _engine.memory.HostResource().allocate(n * 4, 64)
    return torch.from_dlpack(buf.view("f32", n))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=float, default=1e9)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--out", default="")
    ap.add_argument(
        "--schedules",
        default="interleaved,blocked",
        help="engine thread schedules to time (MEGALITH_CPU_SCHEDULE)",
    )
    a = ap.parse_args()
    n = int(a.n)
    torch.set_num_threads(a.threads)
    _engine.set_num_threads(a.threads)

    p = torch.randn(n)
    g = torch.randn(n) * 1e-2
    m, v = torch.zeros(n), torch.zeros(n)
    m.add_(1e-3)  # touch every page before timing
    v.add_(1e-6)
    g16 = g.to(torch.bfloat16)
    copy = torch.empty(n, dtype=torch.bfloat16)
    copy.fill_(1.0)

    step = [0]

    def ours():
        step[0] += 1
        F.adam_step([p], [g], [m], [v], step=step[0], lr=1e-3, weight_decay=0.01)

    def ours_mixed():
        step[0] += 1
        F.adam_step(
            [p],
            [g16],
            [m],
            [v],
            param_copies=[copy],
            step=step[0],
            lr=1e-3,
            weight_decay=0.01,
            grad_scale=1.0 / 1024,
            nonfinite="detect",
        )

    hp, hg, hm, hv = (engine_host_tensor(n) for _ in range(4))
    hp.copy_(p), hg.copy_(g), hm.copy_(m), hv.copy_(v)

    def ours_huge():
        step[0] += 1
        F.adam_step([hp], [hg], [hm], [hv], step=step[0], lr=1e-3, weight_decay=0.01)

    # torch's fused AdamW on the same memory, so the two compare on equal pages
    thp = torch.nn.Parameter(engine_host_tensor(n))
    thp.data.copy_(p)
    thp.grad = engine_host_tensor(n)
    thp.grad.copy_(g)
    topt_huge = torch.optim.AdamW([thp], lr=1e-3, weight_decay=0.01, fused=True)
    topt_huge.state[thp] = {  # its states there too
        "step": torch.tensor(0.0),
        "exp_avg": engine_host_tensor(n).copy_(m),
        "exp_avg_sq": engine_host_tensor(n).copy_(v),
    }

    tp = torch.nn.Parameter(p)
    tp.grad = g
    topt = torch.optim.AdamW([tp], lr=1e-3, weight_decay=0.01, fused=True)

    rows = []
    configs = [("torch fused fp32", topt.step, 28, None)]
    for sched in a.schedules.split(","):
        configs += [
            (f"megalith fp32 [{sched}]", ours, 28, sched),
            (f"megalith bf16 grad + bf16 copy [{sched}]", ours_mixed, 30, sched),
        ]
    configs += [
        ("torch fused fp32 [engine host memory]", topt_huge.step, 28, None),
        ("megalith fp32 [interleaved, engine host memory]", ours_huge, 28, "interleaved"),
    ]
    print(f"transparent huge pages: {thp_mode()}", flush=True)
    for name, fn, bpp, sched in configs:
        if sched:
            os.environ["MEGALITH_CPU_SCHEDULE"] = sched  # read by the engine at each call
        ts = timed(fn, a.steps)
        med = statistics.median(ts)
        rows.append(
            dict(
                impl=name,
                n=n,
                threads=a.threads,
                ms=med * 1e3,
                gparam_s=n / med / 1e9,
                gb_s=bpp * n / med / 1e9,
                all_ms=[t * 1e3 for t in ts],
            )
        )
        print(
            f"{name:46s} {med * 1e3:8.1f} ms  {n / med / 1e9:6.2f} Gparam/s  "
            f"{bpp * n / med / 1e9:6.1f} GB/s",
            flush=True,
        )
    best = max(r["gparam_s"] for r in rows if r["impl"].startswith("megalith fp32"))
    print(
        f"megalith fp32 (best schedule) / torch fused: {best / rows[0]['gparam_s']:.2f}x "
        f"(simd {_engine.simd_level()}, {platform.processor() or platform.machine()})"
    )
    if a.out:
        with open(a.out, "a") as f:
            for r in rows:
                f.write(
                    json.dumps(
                        dict(
                            r,
                            date=time.strftime("%Y-%m-%d"),
                            host=platform.node(),
                            simd=_engine.simd_level(),
                        )
                    )
                    + "\n"
                )


if __name__ == "__main__":
    main()
