#!/usr/bin/env python3
"""Time one megalith CPU optimizer step on one flat parameter of 2^LOG2N elements.

usage: bench_cpu_step.py IMPL LOG2N THREADS [WARMUP=2] [STEPS=5]
       bench_cpu_step.py --check [IMPL ...]   (5 steps on 1e5 params against torch.optim)
       bench_cpu_step.py --list

One configuration per process. Prints one line in the format of the peer
harness (../shared/bench/cpu/bench_opt.py beside the checkout), so both can be summarised together:

    RESULT impl=.. log2n=.. threads=.. bpp=.. ms=t1,t2,... engine_threads=.. simd=..

bpp counts bytes per param the STREAM way, as the peer harness and stream.c
do: bytes read plus bytes written by one ideal pass, no write-allocate traffic.

IMPLs                        B/param (read + written by one ideal pass)
  megalith                     28  fp32 AdamW: p, m, v read and written, g read (7 x 4)
  megalith-bf16grad+copy       28  fp32 master/m/v, bf16 grad scaled by 1024 and unscaled in
                                   the kernel (grad_scale=1/1024), inf/nan detect, fused bf16
                                   param copy written: 8 + 2 + 8 + 8 + 2
  megalith-bf16grad+copy-skip  30  the same with nonfinite=skip: + one pre-pass reading the grad
  megalith-fp16grad            26  fp32 p/m/v, fp16 grad: 8 + 2 + 8 + 8 (as cai-fp16grad)
  megalith-sgd                 20  SGD momentum 0.9: p, buf read and written, g read
  megalith-avx2                28  fp32 AdamW with the SIMD level forced to avx2
  megalith-scalar              28  fp32 AdamW with the SIMD level forced to scalar

All Adam variants: AdamW lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01.
Every buffer is allocated and filled with random data (first touch) before
anything is timed; WARMUP untimed steps precede STEPS timed ones.
"""

import os
import sys
import time

# impl: (grad dtype, param copy dtype, nonfinite, forced SIMD level, B/param)
IMPLS = {
    "megalith": ("float32", None, "ignore", None, 28),
    "megalith-bf16grad+copy": ("bfloat16", "bfloat16", "detect", None, 28),
    "megalith-bf16grad+copy-skip": ("bfloat16", "bfloat16", "skip", None, 30),
    "megalith-fp16grad": ("float16", None, "ignore", None, 26),
    "megalith-sgd": ("float32", None, "ignore", None, 20),
    "megalith-avx2": ("float32", None, "ignore", "avx2", 28),
    "megalith-scalar": ("float32", None, "ignore", "scalar", 28),
}
HP = dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)
SGD_HP = dict(lr=1e-3, momentum=0.9)
LOSS_SCALE = 1024.0  # the bf16 configs get grads scaled by this and unscale them in the kernel


def engine():
    import megalith._engine as e

    return e


class Setup:
    """All buffers of one configuration, allocated and first-touched with random data."""

    def __init__(self, impl, n, seed=0):
        import torch

        e = engine()
        gdt, cdt, nonfinite, simd, _ = IMPLS[impl]
        self.impl, self.n = impl, n
        if simd is not None:
            e.force_simd_level(simd)
            if e.simd_level() != simd:
                raise SystemExit(
                    f"{impl}: asked for SIMD level {simd}, engine runs {e.simd_level()}"
                )
        gen = torch.Generator().manual_seed(seed)
        self.param = torch.randn(n, generator=gen)
        g = torch.randn(n, generator=gen).mul_(1e-2)
        self.scaled = gdt == "bfloat16"
        self.grad_scale = 1.0 / LOSS_SCALE if self.scaled else 1.0
        if self.scaled:
            g.mul_(LOSS_SCALE)
        self.grad = g if gdt == "float32" else g.to(getattr(torch, gdt))
        del g
        # optimizer states: not zeros (a real run is past its first step); v >= 0
        self.exp_avg = torch.randn(n, generator=gen).mul_(1e-3)
        self.exp_avg_sq = (
            None if impl == "megalith-sgd" else torch.rand(n, generator=gen).mul_(1e-5)
        )
        self.param_copy = None if cdt is None else self.param.to(getattr(torch, cdt))
        self.nonfinite = getattr(e.NonFinite, nonfinite)
        if impl == "megalith-sgd":
            self.hyper = e.SgdHyper(**SGD_HP)
        else:
            self.hyper = e.AdamHyper(
                lr=HP["lr"],
                beta1=HP["betas"][0],
                beta2=HP["betas"][1],
                eps=HP["eps"],
                weight_decay=HP["weight_decay"],
                decoupled_weight_decay=True,
            )
        self.t = 0

    def step(self):
        e = engine()
        self.t += 1
        if self.impl == "megalith-sgd":
            return e.sgd_step_flat(
                self.param,
                self.grad,
                self.exp_avg,
                self.param_copy,
                hyper=self.hyper,
                step=self.t,
                grad_scale=self.grad_scale,
                nonfinite=self.nonfinite,
            )
        return e.adam_step_flat(
            self.param,
            self.grad,
            self.exp_avg,
            self.exp_avg_sq,
            None,
            self.param_copy,
            hyper=self.hyper,
            step=self.t,
            grad_scale=self.grad_scale,
            nonfinite=self.nonfinite,
        )


def bench(impl, log2n, threads, warmup, steps):
    import torch

    e = engine()
    torch.set_num_threads(threads)  # only for filling the buffers
    e.set_num_threads(threads)
    s = Setup(impl, 1 << log2n)
    for _ in range(warmup):
        if s.step():
            raise SystemExit(f"{impl}: non-finite gradient reported on finite data")
    ms = []
    for _ in range(steps):
        t0 = time.perf_counter()
        found = s.step()
        ms.append((time.perf_counter() - t0) * 1e3)
        if found:  # a skipped step would time nothing
            raise SystemExit(f"{impl}: non-finite gradient reported on finite data")
    if not torch.isfinite(s.param[:: max(1, s.n // 4096)]).all():
        raise SystemExit("non-finite params")
    print(
        f"RESULT impl={impl} log2n={log2n} threads={threads} bpp={IMPLS[impl][4]} "
        f"ms={','.join(f'{x:.2f}' for x in ms)} engine_threads={e.num_threads()} simd={e.simd_level()}",
        flush=True,
    )


def check(impl):
    """5 steps on 1e5 params vs torch.optim.AdamW(foreach=False) (SGD for megalith-sgd), fp32,
    fed the same (unscaled, upcast) gradient and the same random starting m/v.
    Prints max |p - p_ref| (and the bf16 copy's); fails above 1e-3 of the update size."""
    import torch

    n = 100_000
    s = Setup(impl, n, seed=1)
    p0 = s.param.clone()
    ref_p = torch.nn.Parameter(s.param.clone())
    ref_p.grad = s.grad.float() * s.grad_scale  # exact: the scale is a power of two
    if impl == "megalith-sgd":
        # step 1 sets the buffer to the gradient (as torch does for an empty state)
        ref = torch.optim.SGD([ref_p], foreach=False, **SGD_HP)
    else:
        ref = torch.optim.AdamW([ref_p], foreach=False, **HP)
        ref.state[ref_p] = {
            "step": torch.tensor(0.0),
            "exp_avg": s.exp_avg.clone(),
            "exp_avg_sq": s.exp_avg_sq.clone(),
        }
    for _ in range(5):
        found = s.step()
        ref.step()
    d = (s.param - ref_p.detach()).abs().max().item()
    moved = (ref_p.detach() - p0).abs().max().item()
    line = (
        f"CHECK impl={impl} simd={engine().simd_level()} max|p-p_ref|={d:.3e} "
        f"(update size ~{moved:.1e}) found_nonfinite={found}"
    )
    if s.param_copy is not None:
        dc = (
            (s.param_copy.float() - ref_p.detach().to(s.param_copy.dtype).float())
            .abs()
            .max()
            .item()
        )
        line += f" max|copy-bf16(p_ref)|={dc:.3e}"
    print(line, flush=True)
    ok = d <= 1e-3 * moved + 1e-6 and not found
    return ok


if __name__ == "__main__":
    args = sys.argv[1:]
    if not args or args[0] in ("-h", "--help"):
        print(__doc__)
        sys.exit(0)
    if args[0] == "--list":
        print("\n".join(IMPLS))
        sys.exit(0)
    if args[0] == "--check":
        impls = args[1:] or ["megalith"]
        bad = []
        for impl in impls:
            if impl not in IMPLS:
                raise SystemExit(f"unknown impl {impl}; --list shows them")
            engine().force_simd_level(None)
            if not check(impl):
                bad.append(impl)
        if bad:
            raise SystemExit(f"CHECK FAILED: {' '.join(bad)}")
        sys.exit(0)
    if len(args) < 3 or args[0] not in IMPLS:
        raise SystemExit(
            f"usage: {os.path.basename(sys.argv[0])} IMPL LOG2N THREADS [WARMUP] [STEPS];"
            f" IMPL one of {', '.join(IMPLS)}"
        )
    impl, log2n, threads = args[0], int(args[1]), int(args[2])
    warmup = int(args[3]) if len(args) > 3 else 2
    steps = int(args[4]) if len(args) > 4 else 5
    bench(impl, log2n, threads, warmup, steps)
