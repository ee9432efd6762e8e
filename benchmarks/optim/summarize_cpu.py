#!/usr/bin/env python3
"""Markdown tables from a raw log of run_cpu.sh (megalith, peers, stream.c ceiling).

usage: summarize_cpu.py RAW.txt > table.md

Per (size, threads): median ms/step over every timed step of every round,
Mparam/s, GB/s = B/param x N / median time, and the fraction of the measured
Adam-shaped ceiling (stream.c's `adamw` kernel, median GB/s at that thread
count). Then the ratios issue 2 asks for; speed-ups are peer ms / megalith ms
(> 1: megalith faster).
"""

import re
import statistics as st
import sys
from collections import defaultdict

BUSY_NOTE = 0.15  # run_cpu.sh's BUSY_MAX: a config that began on a busier machine is noted
FP32_PEERS = ["torch-single", "torch-foreach", "torch-fused", "ds", "cai"]
ORDER = [
    "megalith",
    "megalith-bf16grad+copy",
    "megalith-bf16grad+copy-skip",
    "megalith-fp16grad",
    "megalith-avx2",
    "megalith-scalar",
    "megalith-sgd",
    "torch-single",
    "torch-foreach",
    "torch-fused",
    "torch-fused+bf16",
    "ds",
    "ds-bf16",
    "cai",
    "cai-fp16grad",
    "cai-fp16",
    "sgd-foreach",
]
NOTE = {
    "megalith": "fp32 AdamW",
    "megalith-bf16grad+copy": "fp32 master/m/v, bf16 grad, unscale + inf/nan detect, fused bf16 copy",
    "megalith-bf16grad+copy-skip": "same, nonfinite=skip (grad pre-pass)",
    "megalith-fp16grad": "fp32 p/m/v, fp16 grad",
    "megalith-avx2": "fp32 AdamW, forced AVX2",
    "megalith-scalar": "fp32 AdamW, forced scalar",
    "megalith-sgd": "SGD momentum 0.9",
    "torch-single": "AdamW foreach=False",
    "torch-foreach": "AdamW foreach=True",
    "torch-fused": "AdamW fused=True",
    "torch-fused+bf16": "fused fp32 step, then bf16 copy (2 passes)",
    "ds": "DeepSpeedCPUAdam fp32",
    "ds-bf16": "DeepSpeedCPUAdam bf16 p+g, fp32 m/v (no master)",
    "cai": "ColossalAI CPUAdam fp32",
    "cai-fp16grad": "ColossalAI CPUAdam, fp16 grad",
    "cai-fp16": "ColossalAI CPUAdam, fp16 p+g",
    "sgd-foreach": "torch SGD momentum 0.9 foreach",
}


def kv(line):
    return dict(re.findall(r"(\w+)=(\S+)", line))


def parse(path):
    header, checks, fails, notes = [], [], [], []
    bw = defaultdict(list)  # (kernel, threads) -> GB/s samples
    opt = defaultdict(list)  # (log2n, threads, impl) -> ms samples
    bpp = {}
    for line in open(path):
        line = line.rstrip("\n")
        d = kv(line)
        if float(d.get("busy", 0)) > BUSY_NOTE:
            what = d.get("impl") or f"stream {d.get('kernel')}"
            note = (
                f"{what} 2^{d.get('log2n', 27)} threads={d.get('threads')} round={d.get('round')}: "
                f"CPUs {d['busy']} busy just before it ran"
            )
            if note not in notes:  # stream.c prints one line per kernel and rep
                notes.append(note)
        if line.startswith("STREAM"):
            bw[(d["kernel"], int(d["threads"]))].append(float(d["gbs"]))
        elif line.startswith("RESULT"):
            opt[(int(d["log2n"]), int(d["threads"]), d["impl"])] += [
                float(x) for x in d["ms"].split(",")
            ]
            bpp[d["impl"]] = int(d["bpp"])
        elif line.startswith("CHECK"):
            checks.append(line)
        elif line.startswith("FAIL"):
            fails.append(line)
        elif line.startswith("# WARNING"):
            notes.append(line[2:])
        elif line.startswith("# round=") or line.startswith("# done"):
            notes.append(line[2:])
        elif line.startswith("#"):
            header.append(line[2:])
    return header, checks, fails, notes, bw, opt, bpp


def mmm(xs, fmt="{:.1f}"):
    return f"{fmt.format(st.median(xs))} ({fmt.format(min(xs))}-{fmt.format(max(xs))})"


def main(path):
    header, checks, fails, notes, bw, opt, bpp = parse(path)
    out = []
    p = out.append
    date = next((h.split()[1] for h in header if h.startswith("date:")), "?")
    p(f"# CPU optimizer step: megalith vs peers, {date}\n")
    p(
        f"Raw log: `{path.rsplit('/', 1)[-1]}`. Made by `benchmarks/optim/run_cpu.sh`, "
        "summarised by `benchmarks/optim/summarize_cpu.py`.\n"
    )
    p("```text")
    out.extend(header)
    p("```\n")

    ceiling = {t: st.median(bw[("adamw", t)]) for t in (1, 2) if bw.get(("adamw", t))}
    p("## Bandwidth ceiling (stream.c, 2^27 fp32 params / 1 GiB f64 arrays, 4 KiB pages)\n")
    p(
        "GB/s counted the STREAM way (bytes read + written in source, no write-allocate);"
        " median (min-max) over all reps and rounds. `adamw` is the Adam-shaped ceiling used below.\n"
    )
    p("| kernel | 1 thread | 2 threads |")
    p("|---|---|---|")
    for k in ["copy", "scale", "add", "triad", "adam7", "adamw"]:
        cells = [
            f"{mmm(bw[(k, t)])} n={len(bw[(k, t)])}" if bw.get((k, t)) else "n/a" for t in (1, 2)
        ]
        p(f"| {k} | " + " | ".join(cells) + " |")
    p("")

    def med(n2, t, impl):
        xs = opt.get((n2, t, impl))
        return st.median(xs) if xs else None

    groups = sorted({(k[0], k[1]) for k in opt}, key=lambda g: (-g[1], g[0]))
    p(
        "## Optimizer step (one flat parameter of N elements; median (min-max) over all timed steps)\n"
    )
    p(
        "B/param: bytes one ideal pass reads + writes (STREAM convention, as bench_opt.py counts the peers).\n"
    )
    for n2, t in groups:
        c = ceiling.get(t)
        p(
            f"### N = 2^{n2}, {t} thread{'s' if t > 1 else ''}"
            f" (ceiling {f'{c:.1f} GB/s' if c else 'not measured'})\n"
        )
        p("| impl | what | B/param | n | ms/step | Mparam/s | GB/s | of ceiling |")
        p("|---|---|---|---|---|---|---|---|")
        impls = sorted(
            {k[2] for k in opt if k[:2] == (n2, t)},
            key=lambda i: ORDER.index(i) if i in ORDER else 99,
        )
        for impl in impls:
            ms = opt[(n2, t, impl)]
            m = st.median(ms) / 1e3
            n = 1 << n2
            gbs = bpp[impl] * n / m / 1e9
            frac = f"{gbs / c:.2f}" if c else "n/a"
            name = f"**{impl}**" if impl.startswith("megalith") else impl
            p(
                f"| {name} | {NOTE.get(impl, '')} | {bpp[impl]} | {len(ms)} | {mmm(ms, '{:.2f}')} |"
                f" {n / m / 1e6:.0f} | {gbs:.1f} | {frac} |"
            )
        p("")

    p("## Issue 2 targets\n")
    p("Speed-up = peer median ms / megalith median ms (> 1: megalith faster).\n")
    p("| N, threads | comparison | megalith ms | other | other ms | result | target | met |")
    p("|---|---|---|---|---|---|---|---|")

    def row(g, what, ours, other, target, good, other_ms=None, other_name=None, result=None):
        n2, t = g
        mo = med(n2, t, ours)
        mp = other_ms if other_ms is not None else med(n2, t, other)
        if mo is None or mp is None:
            return
        r = result if result is not None else mp / mo
        rs = f"{r:.2f}x" if result is None else f"{r:.2f}"
        met = "yes" if good(r) else "**no**" if good is not None else ""
        p(
            f"| 2^{n2}, {t} | {what} | {mo:.2f} | {other_name or other} | {mp:.2f} | {rs} | {target} | {met} |"
        )

    for g in groups:
        n2, t = g
        mo = med(n2, t, "megalith")
        if mo is not None and t in ceiling:
            gbs = bpp["megalith"] * (1 << n2) / (mo / 1e3) / 1e9
            c = ceiling[t]
            row(
                g,
                "megalith fp32, fraction of adamw ceiling",
                "megalith",
                None,
                ">= 0.95",
                lambda r: r >= 0.95,
                other_ms=28 * (1 << n2) / c / 1e6,
                other_name=f"ceiling {c:.1f} GB/s",
                result=gbs / c,
            )
        peers = [(med(n2, t, i), i) for i in FP32_PEERS if med(n2, t, i) is not None]
        if peers:
            pm, pi = min(peers)
            row(
                g,
                "megalith fp32 vs fastest fp32 peer",
                "megalith",
                None,
                ">= 1.00",
                lambda r: r >= 1.0,
                other_ms=pm,
                other_name=pi,
            )
        for other, target, good in [
            ("torch-fused+bf16", ">= 1.50", lambda r: r >= 1.5),
            ("ds-bf16", "> 1", lambda r: r > 1.0),
            ("cai-fp16grad", "> 1", lambda r: r > 1.0),
        ]:
            row(
                g,
                "megalith-bf16grad+copy vs " + other,
                "megalith-bf16grad+copy",
                other,
                target,
                good,
            )
    p("")
    p("Other comparisons (no target):\n")
    p("| N, threads | comparison | megalith ms | other | other ms | speed-up |")
    p("|---|---|---|---|---|---|")
    for n2, t in groups:
        for ours, other in [
            ("megalith-fp16grad", "cai-fp16grad"),
            ("megalith-sgd", "sgd-foreach"),
            ("megalith-bf16grad+copy-skip", "torch-fused+bf16"),
            ("megalith-bf16grad+copy-skip", "megalith-bf16grad+copy"),
            ("megalith-avx2", "megalith"),
            ("megalith-scalar", "megalith"),
            ("megalith", "torch-fused"),
        ]:
            mo, mp = med(n2, t, ours), med(n2, t, other)
            if mo is not None and mp is not None:
                p(
                    f"| 2^{n2}, {t} | {ours} vs {other} | {mo:.2f} | {other} | {mp:.2f} | {mp / mo:.2f}x |"
                )
    p("")

    p("## Correctness checks (5 steps on 1e5 params against torch.optim, fp32)\n")
    p("```text")
    out.extend(checks or ["(none in this log)"])
    p("```")
    if fails or notes:
        p("\n## Run log\n")
        out.extend(f"- {x}" for x in fails + notes)
    print("\n".join(out))


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    main(sys.argv[1])
