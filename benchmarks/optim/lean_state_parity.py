"""Loss parity of adamw's lean states (issue 20): `megalith train` runs of one model, data
and schedule with --optim-state-dtype fp32, bf16 and int8, compared step for step.

    python benchmarks/optim/lean_state_parity.py RUNS_DIR --names parity_fp32,parity_bf16,\
parity_int8 --out benchmarks/results/optim_cpu/<date>_<machine>_lean_state_parity.md

Each run is RUNS_DIR/<name>/metrics.jsonl (one row per step; validation rows carry
val_loss). The first name is the reference. Runs stopped early (--max-time) are compared
up to the last step every run reached: the schedule is the same, so the curves are too.

--train-masters STEPS first trains the runs itself (in this process, one after another):
a bf16 gpt-tiny (every parameter bfloat16) on the built-in corpus with CPUAdam, the same
data, schedule and clipping in each, under one of three master rules (MASTERS):
master_fp32 (persistent fp32 masters, the fp32-shadow path of the mixed-precision
wrapper: Fp32Shadows(keep_masters=True)), master_bf16 (master_dtype="bf16": the bf16
parameter is its own master with a bf16 Kahan compensation) and no_master (each step
rounds to bf16, megalith.nn.optimizer.CPUAdam's own bf16 rule). Each run also writes
bytes.json: bytes per parameter of parameters + masters + optimizer states.

    python benchmarks/optim/lean_state_parity.py RUNS_DIR --train-masters 2000 \
      --names master_fp32,master_bf16,no_master --out ..._master_bf16_parity.md
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

#: train losses are averaged over this many steps before they are compared
WINDOW = 50


def read(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def window_mean(rows: list[dict], end: int) -> float:
    losses = [r["loss"] for r in rows if end - WINDOW < r["step"] <= end]
    return sum(losses) / len(losses)


def diverged(rows: list[dict], ref: list[dict]) -> bool:
    """A non-finite loss, or a window mean 10% above the reference's at the same step."""
    if not all(math.isfinite(r["loss"]) for r in rows):
        return True
    last = min(rows[-1]["step"], ref[-1]["step"])
    return any(
        window_mean(rows, s) > 1.1 * window_mean(ref, s) for s in range(WINDOW, last + 1, WINDOW)
    )


def table(runs: dict[str, list[dict]]) -> str:
    names = list(runs)
    ref = runs[names[0]]
    common = min(rows[-1]["step"] for rows in runs.values())
    marks = [s for s in (250, 500, 750, 1000, 1250, 1500, 1750, 2000) if s <= common]
    if not marks or marks[-1] != common:
        marks.append(common)
    lines = [
        f"Train loss, mean of the {WINDOW} steps up to each step (nats per byte):",
        "",
        "| step | " + " | ".join(names) + " |",
        "|---|" + "---|" * len(names),
    ]
    for s in marks:
        cells = []
        for n in names:
            value = window_mean(runs[n], s)
            rel = value / window_mean(ref, s) - 1
            cells.append(f"{value:.4f}" + ("" if n == names[0] else f" ({rel:+.2%})"))
        lines.append(f"| {s} | " + " | ".join(cells) + " |")
    lines += ["", "Validation loss (the runs' own evaluations):", ""]
    lines += ["| step | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    val_steps = sorted(
        {r["step"] for r in ref if "val_loss" in r and r["step"] <= common}
        & set.intersection(
            *({r["step"] for r in rows if "val_loss" in r} for rows in runs.values())
        )
    )
    for s in val_steps:
        vals = [
            next(r["val_loss"] for r in runs[n] if r["step"] == s and "val_loss" in r)
            for n in names
        ]
        lines.append(f"| {s} | " + " | ".join(f"{v:.4f}" for v in vals) + " |")
    lines += [
        "",
        f"| run | steps reached | final loss vs reference (at step {common}) | diverged |",
        "|---|---|---|---|",
    ]
    for n in names:
        rel = window_mean(runs[n], common) / window_mean(ref, common) - 1
        lines.append(
            f"| {n} | {runs[n][-1]['step']} | {rel:+.2%} | {'yes' if diverged(runs[n], ref) else 'no'} |"
        )
    return "\n".join(lines) + "\n"


def plot(runs: dict[str, list[dict]], path: str) -> None:
    """The train losses (WINDOW-step means) of every run on one figure (matplotlib)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for name, rows in runs.items():
        steps = list(range(WINDOW, rows[-1]["step"] + 1, 10))
        ax.plot(steps, [window_mean(rows, s) for s in steps], label=name, lw=1)
    ax.set_xlabel("step")
    ax.set_ylabel(f"train loss ({WINDOW}-step mean, nats)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


# ------------------------------------------------- --train-masters: the runs themselves

#: the master rules --train-masters compares (see the module doc)
MASTERS = ("master_fp32", "master_bf16", "no_master")
BATCH, SEQ, LR, MIN_LR, WARMUP, WD, CLIP, EVAL_EVERY, EVAL_BATCHES = (
    8,
    64,
    2e-3,
    2e-4,
    30,
    0.1,
    1.0,
    250,
    4,
)


def _lr(step: int, steps: int) -> float:
    """Linear warm-up, then cosine from LR to MIN_LR (megalith train's schedule)."""
    if step <= WARMUP:
        return LR * step / WARMUP
    t = (step - WARMUP) / max(1, steps - WARMUP)
    return MIN_LR + 0.5 * (LR - MIN_LR) * (1 + math.cos(math.pi * t))


def _optimizer(rule: str, params: list) -> tuple:
    """(optimizer, step function, the fp32 masters it keeps or None)."""
    import megalith.nn.optimizer as cai
    from megalith.nn.optimizer.fp32_shadows import Fp32Shadows
    from megalith_core.optim import CPUAdam

    kw = dict(lr=LR, weight_decay=WD, betas=(0.9, 0.95))
    if rule == "master_bf16":
        opt = CPUAdam(params, master_dtype="bf16", **kw)
        return opt, opt.step, None
    if rule == "no_master":
        opt = cai.CPUAdam(params, **kw)
        return opt, opt.step, None
    shadows = Fp32Shadows(keep_masters=True)
    opt = CPUAdam(params, **kw)

    def step() -> None:
        with shadows.stepping(opt):
            opt.step()

    return opt, step, shadows


def _bytes_per_param(params: list, opt, shadows) -> dict[str, float]:
    import torch

    n = sum(p.numel() for p in params)
    held = [(k, t) for st in opt.state.values() for k, t in st.items() if torch.is_tensor(t)]
    size = {k: 0 for k in ("states", "comp")}
    for k, t in held:
        if k != "step":  # the Kahan compensation is half of a bf16 master
            size["comp" if k == "param_comp" else "states"] += t.numel() * t.element_size()
    states = size["states"]
    masters = size["comp"]
    if shadows is not None:
        masters += sum(t.numel() * t.element_size() for t, _ in shadows._masters.values())
    out = {
        "params": sum(p.numel() * p.element_size() for p in params) / n,
        "masters": masters / n,
        "states": states / n,
    }
    out["total"] = sum(out.values())
    return out


def train_masters(runs_dir: Path, names: list[str], steps: int, seed: int) -> None:
    import torch

    import megalith.models
    from megalith.train import corpus

    text = corpus.load(None, 20 * (SEQ + 1))
    for rule in names:
        if rule not in MASTERS:
            raise SystemExit(f"--train-masters: run {rule!r}; expected names from {MASTERS}")
        model = megalith.models.create("gpt-tiny", device="cpu", seed=seed, vocab_size=256)
        model = model.to(torch.bfloat16)
        params = list(model.parameters())
        opt, step_fn, shadows = _optimizer(rule, params)
        out = runs_dir / rule
        out.mkdir(parents=True, exist_ok=True)
        rows, start = [], time.perf_counter()
        for step in range(1, steps + 1):
            for g in opt.param_groups:
                g["lr"] = _lr(step, steps)
            ids = corpus.batch(
                text.train, BATCH, SEQ, corpus.batch_generator(seed, step, 0, "train")
            )
            loss = model(ids, labels=ids)[0]
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, CLIP)
            step_fn()
            opt.zero_grad(set_to_none=True)
            row = {"step": step, "loss": float(loss.detach().float())}
            if step % EVAL_EVERY == 0 or step == steps:
                with torch.no_grad():
                    vals = [
                        float(model(v, labels=v)[0].float())
                        for v in (
                            corpus.batch(
                                text.val, BATCH, SEQ, corpus.batch_generator(seed, i, 0, "val")
                            )
                            for i in range(EVAL_BATCHES)
                        )
                    ]
                row["val_loss"] = sum(vals) / len(vals)
                print(f"{rule} step {step} loss {row['loss']:.4f} val {row['val_loss']:.4f} "
                      f"({time.perf_counter() - start:.0f} s)", flush=True)  # fmt: skip
            rows.append(row)
        (out / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        size = _bytes_per_param(params, opt, shadows)
        size["seconds"] = time.perf_counter() - start
        (out / "bytes.json").write_text(json.dumps(size) + "\n")


def bytes_table(runs_dir: Path, names: list[str]) -> str:
    sizes = {n: runs_dir / n / "bytes.json" for n in names}
    if not all(p.exists() for p in sizes.values()):
        return ""
    lines = [
        "",
        "Bytes per parameter (measured from the tensors each run holds after its last step):",
        "",
        "| run | params | masters | optimizer states | total |",
        "|---|---|---|---|---|",
    ]
    for n, path in sizes.items():
        b = json.loads(path.read_text())
        lines.append(
            f"| {n} | {b['params']:.2f} | {b['masters']:.2f} | {b['states']:.2f} | {b['total']:.2f} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("runs_dir")
    ap.add_argument("--names", default="parity_fp32,parity_bf16,parity_int8")
    ap.add_argument("--out", default="")
    ap.add_argument("--png", default="", help="the curves on one figure (matplotlib)")
    ap.add_argument("--title", default="# Lean Adam states: loss parity")
    ap.add_argument(
        "--train-masters",
        type=int,
        default=0,
        metavar="STEPS",
        help="train the runs (names from MASTERS) here first: a bf16 gpt-tiny per master rule",
    )
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    names = a.names.split(",")
    if a.train_masters:
        train_masters(Path(a.runs_dir), names, a.train_masters, a.seed)
    runs = {n: read(Path(a.runs_dir) / n / "metrics.jsonl") for n in names}
    text = a.title + "\n\n" + table(runs) + bytes_table(Path(a.runs_dir), names)
    print(text)
    if a.out:
        Path(a.out).write_text(text)
    if a.png:
        plot(runs, a.png)


if __name__ == "__main__":
    main()
