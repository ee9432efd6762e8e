#!/usr/bin/env python3
"""megalith's CUDA AdamW against torch.optim.AdamW(fused=True), same run, same GPU.

usage: gpu_adam.py [--out PATH] [--steps 30] [--warmup 5] [--scale 1.0] [--layouts 8x125M,gpt292]

Two layouts of ~1e9 fp32 parameters (the ideas of ../shared/bench/gpu/adam_layouts.py, the
shared peer harness beside the checkout):
  8x125M   eight flat tensors of 125M elements
  gpt292   the 292 tensors of a d=2048, 18-layer GPT with separate q/k/v (~1.014e9)

For each layout, after a correctness check on the GPT layout (3 steps of megalith
and torch fused from the same start and the same gradients; max differences printed
and recorded), it times:
  torch-fused          torch.optim.AdamW(fused=True), fp32 p/g/m/v          28 B/param
  megalith             megalith._engine.cuda_adam_step, fp32 p/g/m/v        28 B/param
  megalith-bf16g+copy  fp32 master p/m/v, bf16 grad in, bf16 param copy out 28 B/param
                       (8 p + 2 g + 8 m + 8 v + 2 copy): the mixed-precision step in one pass
and the device-to-device copy bandwidth (read + write) of a 4 GiB buffer, the ceiling.
Each step is bracketed by CUDA events without host syncs in between (the host runs
ahead, so launch overhead is hidden as it is in training); warm-up steps first; the
median of --steps timed steps is reported. Bytes per param count one ideal pass (bytes
read + bytes written), as the anchors in ../shared/ANCHORS.md do.

Prints a table and appends JSON lines to --out
(default benchmarks/results/optim_gpu/<UTC date>_gpu.jsonl: rename gpu to the machine).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys

import numpy as np
import torch

HP = dict(lr=1e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.01)
BYTES_PER_PARAM = 28


# ------------------------------------------------------------------ layouts


def layout_chunks(scale=1.0, n_tensors=8, size=125_000_000):
    return [(max(1, int(size * scale)),)] * n_tensors


def layout_gpt(scale=1.0, d=2048, layers=18, vocab=50304, seq=2048):
    """292 tensors, ~1.014e9 params at scale 1 (scale shrinks d, keeping the tensor count)."""
    d = max(64, int(d * scale**0.5) // 64 * 64)
    shapes = [(vocab, d), (seq, d)]
    for _ in range(layers):
        shapes += [(d,), (d,)]  # ln1
        for _ in range(3):  # q, k, v
            shapes += [(d, d), (d,)]
        shapes += [(d, d), (d,)]  # proj
        shapes += [(d,), (d,)]  # ln2
        shapes += [(4 * d, d), (4 * d,), (d, 4 * d), (d,)]  # mlp
    shapes += [(d,), (d,)]  # ln_f
    return shapes


LAYOUTS = {"8x125M": layout_chunks, "gpt292": layout_gpt}


def numel(shape):
    n = 1
    for x in shape:
        n *= x
    return n


# ---------------------------------------------------------------- optimizers


def engine():
    import megalith._engine as e

    return e


class MegalithAdamW:
    """megalith's multi-tensor CUDA AdamW over per-tensor buffers, driven through the
    pointer-table entry point (one engine call per step)."""

    def __init__(self, params, grads, grad_dtype="f32", copy=False):
        e = engine()
        self.e = e
        self.params = params
        self.grads = grads
        self.m = [torch.zeros_like(p) for p in params]
        self.v = [torch.zeros_like(p) for p in params]
        self.copies = [torch.empty_like(p, dtype=torch.bfloat16) for p in params] if copy else None
        n = len(params)
        table = np.zeros((n, 6), dtype=np.int64)
        for i in range(n):
            table[i, 0] = params[i].data_ptr()
            table[i, 1] = grads[i].data_ptr()
            table[i, 2] = self.m[i].data_ptr()
            table[i, 3] = self.v[i].data_ptr()
            table[i, 5] = self.copies[i].data_ptr() if copy else 0
        self.table = table
        self.numels = np.array([p.numel() for p in params], dtype=np.int64)
        h = e.AdamHyper()
        h.lr, h.eps, h.weight_decay = HP["lr"], HP["eps"], HP["weight_decay"]
        h.beta1, h.beta2 = HP["betas"]
        h.decoupled_weight_decay = True  # AdamW
        h.amsgrad, h.bias_correction, h.maximize = False, True, False
        self.hyper = h
        self.args = e.StepArgs()
        self.args.grad_dtype = getattr(e.DType, grad_dtype)
        self.args.copy_dtype = e.DType.bf16
        self.args.grad_scale = 1.0
        self.args.nonfinite = e.NonFinite.ignore
        self.dev = e.DeviceScalars()
        self.step_no = 0

    def step(self):
        self.step_no += 1
        self.args.step = self.step_no
        stream = torch.cuda.current_stream().cuda_stream
        self.e.cuda_adam_step(self.table, self.numels, self.hyper, self.args, self.dev, stream)


# ------------------------------------------------------------------- timing


def time_steps(step, warmup, steps):
    """Milliseconds per step: events around each step, one sync at the end."""
    for _ in range(warmup):
        step()
    torch.cuda.synchronize()
    evs = [
        (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
        for _ in range(steps)
    ]
    for s, e in evs:
        s.record()
        step()
        e.record()
    torch.cuda.synchronize()
    return [s.elapsed_time(e) for s, e in evs]


def copy_ceiling(warmup, steps, n=1 << 30):
    """Device-to-device copy of n fp32 values; GB/s counting bytes read + written."""
    bufs = [torch.randn(n, device="cuda"), torch.empty(n, device="cuda")]
    ms = time_steps(lambda: bufs[1].copy_(bufs[0]), warmup, steps)
    bufs.clear()
    torch.cuda.empty_cache()
    return ms, 2 * 4 * n


def summary(ms):
    return {"ms_median": statistics.median(ms), "ms_min": min(ms), "ms_max": max(ms), "n": len(ms)}


# -------------------------------------------------------------- correctness


def check_against_torch(params, grads, steps=3):
    """megalith and torch fused AdamW from the same params, the same grads: max diffs."""
    torch_ps = [torch.nn.Parameter(p.detach().clone()) for p in params]
    ours_ps = [p.detach().clone() for p in params]
    for tp, g in zip(torch_ps, grads):
        tp.grad = g
    opt = torch.optim.AdamW(torch_ps, fused=True, **HP)
    ours = MegalithAdamW(ours_ps, grads)
    for _ in range(steps):
        opt.step()
        ours.step()
    torch.cuda.synchronize()
    worst = {"p_max_abs": 0.0, "p_max_rel": 0.0, "m_max_rel": 0.0, "v_max_rel": 0.0}

    def rel(a, b):  # elementwise, floored so near-zero values do not dominate
        return (
            ((a - b).abs() / b.abs().clamp_min(1e-3 * b.abs().max().clamp_min(1e-30))).max().item()
        )

    for i, tp in enumerate(torch_ps):
        st = opt.state[tp]
        worst["p_max_abs"] = max(worst["p_max_abs"], (ours_ps[i] - tp.detach()).abs().max().item())
        worst["p_max_rel"] = max(worst["p_max_rel"], rel(ours_ps[i], tp.detach()))
        worst["m_max_rel"] = max(worst["m_max_rel"], rel(ours.m[i], st["exp_avg"]))
        worst["v_max_rel"] = max(worst["v_max_rel"], rel(ours.v[i], st["exp_avg_sq"]))
    del opt, ours, torch_ps, ours_ps
    torch.cuda.empty_cache()
    return worst


# --------------------------------------------------------------------- main


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    today = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")
    ap.add_argument("--out", default=f"benchmarks/results/optim_gpu/{today}_gpu.jsonl")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--scale", type=float, default=1.0, help="shrink the layouts (smoke tests)")
    ap.add_argument("--layouts", default=",".join(LAYOUTS))
    ap.add_argument("--no-check", action="store_true", help="skip the correctness check")
    a = ap.parse_args(argv)
    if a.steps < 20:
        ap.error("--steps must be >= 20 (the median of at least 20 steps is reported)")
    if not torch.cuda.is_available():
        print("no CUDA device: nothing to time", file=sys.stderr)
        return 77
    e = engine()
    if e.cuda_device_count() == 0:
        print(f"megalith sees no GPU: {e.cuda_status()}", file=sys.stderr)
        return 1

    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    dev_name = torch.cuda.get_device_name()
    common = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "device": dev_name,
        "torch": torch.__version__,
        "megalith_cuda": e.cuda_status(),
        "hyper": {**HP, "betas": list(HP["betas"])},
        "warmup": a.warmup,
        "steps": a.steps,
    }
    rows = []

    def record(**kw):
        row = {**common, **kw}
        rows.append(row)
        with open(a.out, "a") as f:
            f.write(json.dumps(row) + "\n")
        return row

    ms, nbytes = copy_ceiling(a.warmup, a.steps)
    copy_gbps = nbytes / (statistics.median(ms) / 1e3) / 1e9
    ceiling_gparam = copy_gbps / BYTES_PER_PARAM
    record(
        name="copy_ceiling",
        impl="torch copy_",
        unit="ms",
        bytes=nbytes,
        GBps=copy_gbps,
        gparam_per_s_at_28B=ceiling_gparam,
        **summary(ms),
        how="dst.copy_(src), 2^30 fp32, GB/s = (read + write) / median",
    )
    print(
        f"{dev_name}: copy ceiling {copy_gbps:.0f} GB/s -> {ceiling_gparam:.1f} Gparam/s at 28 B/param"
    )

    for lname in a.layouts.split(","):
        shapes = LAYOUTS[lname](a.scale)
        n = sum(numel(s) for s in shapes)
        gen = torch.Generator(device="cuda").manual_seed(0)
        params = [torch.randn(s, device="cuda", generator=gen) for s in shapes]
        grads = [torch.randn(s, device="cuda", generator=gen) * 1e-2 for s in shapes]

        if lname == "gpt292" and not a.no_check:
            worst = check_against_torch(params, grads)
            record(
                name=f"check_{lname}",
                impl="megalith vs torch-fused",
                n_params=n,
                n_tensors=len(shapes),
                **worst,
                how="3 AdamW steps from the same params and grads; rel floored at 1e-3*max|ref|",
            )
            print(
                f"{lname}: megalith vs torch fused after 3 steps: "
                + ", ".join(f"{k} {v:.2e}" for k, v in worst.items())
            )

        results = {}
        # torch fused AdamW: its own params (same values), grads shared.
        tps = [torch.nn.Parameter(p.detach().clone()) for p in params]
        for tp, g in zip(tps, grads):
            tp.grad = g
        opt = torch.optim.AdamW(tps, fused=True, **HP)
        results["torch-fused"] = time_steps(opt.step, a.warmup, a.steps)
        del opt, tps
        torch.cuda.empty_cache()

        ours = MegalithAdamW(params, grads)
        results["megalith"] = time_steps(ours.step, a.warmup, a.steps)
        del ours
        torch.cuda.empty_cache()

        grads_bf16 = [g.to(torch.bfloat16) for g in grads]
        del grads
        torch.cuda.empty_cache()
        ours = MegalithAdamW(params, grads_bf16, grad_dtype="bf16", copy=True)
        results["megalith-bf16g+copy"] = time_steps(ours.step, a.warmup, a.steps)
        assert all(torch.isfinite(c).all() for c in ours.copies[:2])
        del ours, grads_bf16, params
        torch.cuda.empty_cache()

        t_ref = statistics.median(results["torch-fused"])
        for impl, ms in results.items():
            med = statistics.median(ms)
            gp = n / (med / 1e3) / 1e9
            record(
                name=f"gpu_adamw_{impl}_{lname}",
                impl=impl,
                layout=lname,
                n_params=n,
                n_tensors=len(shapes),
                unit="ms/step",
                **summary(ms),
                gparam_per_s=gp,
                eff_GBps=BYTES_PER_PARAM * gp,
                bytes_per_param=BYTES_PER_PARAM,
                of_copy_ceiling=gp / ceiling_gparam,
                speedup_vs_torch_fused=t_ref / med,
                how=f"{len(shapes)} tensors, {n} params, random p/g, {a.warmup} warm-up + {a.steps} timed "
                "steps, CUDA events per step, median",
            )

    print()
    hdr = f"{'layout':8} {'impl':22} {'ms med':>8} {'ms min':>8} {'Gparam/s':>9} {'GB/s':>7} {'of copy':>8} {'vs torch':>9}"
    print(hdr)
    print("-" * len(hdr))
    for r in rows:
        if "layout" not in r:
            continue
        print(
            f"{r['layout']:8} {r['impl']:22} {r['ms_median']:8.3f} {r['ms_min']:8.3f} {r['gparam_per_s']:9.1f} "
            f"{r['eff_GBps']:7.0f} {r['of_copy_ceiling']:8.1%} {r['speedup_vs_torch_fused']:8.2f}x"
        )
    print(
        f"\ncopy ceiling {copy_gbps:.0f} GB/s ({ceiling_gparam:.1f} Gparam/s at 28 B/param); rows appended to {a.out}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
