"""`megalith train`'s optimizer, learning-rate schedule and run-directory options:
checked once before any rank starts (ValueError naming the option and the fix), then
built on every rank."""

from __future__ import annotations

import argparse
import math
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from . import compile as run_compile
from . import tensorboard_log

#: betas when --betas is left out (adamw: the loop's long-standing 0.9, 0.95)
DEFAULT_BETAS = {"adamw": (0.9, 0.95), "lion": (0.9, 0.99)}


def betas(args: argparse.Namespace) -> tuple[float, float]:
    if args.betas is None:
        return DEFAULT_BETAS.get(args.optimizer, (0.9, 0.95))
    words = str(args.betas).split(",")
    try:
        b = tuple(float(w) for w in words)
    except ValueError:
        b = ()
    if len(b) != 2 or not all(0.0 <= x < 1.0 for x in b):
        raise ValueError(f"--betas {args.betas}; expected two numbers in [0, 1), e.g. 0.9,0.95")
    return b  # type: ignore[return-value]


def min_lr(args: argparse.Namespace) -> float:
    """--min-lr, by default a tenth of --lr (the floor of the cosine and linear decays)."""
    return 0.1 * args.lr if args.min_lr is None else args.min_lr


def _has_gpu() -> bool:
    import torch

    return torch.cuda.is_available()


def check(args: argparse.Namespace) -> None:
    """ValueError naming the first option that cannot work."""
    for name in ("steps", "batch_size", "seq_len", "eval_batches", "eval_every"):
        if getattr(args, name, 1) < 1:
            raise ValueError(f"--{name.replace('_', '-')} {getattr(args, name)}; expected >= 1")
    if getattr(args, "save_every", 1) < 0:
        raise ValueError(f"--save-every {args.save_every}; expected >= 1 steps, or 0 for none")
    if getattr(args, "save_every", 1) == 0 and getattr(args, "resume", None):
        raise ValueError("--save-every 0 with --resume; a run that saves nothing cannot go on")
    budget = getattr(args, "device_budget_gb", None)
    if getattr(args, "offload", "none") == "auto" and budget is None and not _has_gpu():
        raise ValueError(
            "--offload auto on CPU ranks needs --device-budget-gb (the simulated device's "
            "memory); on a GPU it defaults to the GPU's memory"
        )
    if args.grad_accum < 1:
        raise ValueError(f"--grad-accum {args.grad_accum}; expected >= 1 micro-batches per step")
    if args.warmup < 0:
        raise ValueError(f"--warmup {args.warmup}; expected >= 0 steps")
    if not args.lr > 0:
        raise ValueError(f"--lr {args.lr}; expected a positive learning rate")
    lean = getattr(args, "optim_state_dtype", "fp32")
    if lean != "fp32" and args.optimizer != "adamw":
        raise ValueError(
            f"--optim-state-dtype {lean} with --optimizer {args.optimizer}; lean states are "
            "adamw's: use --optimizer adamw, or --optim-state-dtype fp32"
        )
    lean_plugins = ("ddp", "zero1", "zero2", "gemini", None)  # ZeRO chunks keep them too
    if lean != "fp32" and getattr(args, "plugin", "ddp") not in lean_plugins:
        raise ValueError(
            f"--optim-state-dtype {lean} with --plugin {args.plugin}; lean states are kept by "
            "--plugin ddp, zero1, zero2 and gemini (with or without --offload): use one of "
            "them, or --optim-state-dtype fp32"
        )
    if args.betas is not None and args.optimizer == "sgd":
        raise ValueError("--betas is for --optimizer adamw or lion; sgd takes --momentum")
    betas(args)
    if not 0.0 <= args.momentum < 1.0:
        raise ValueError(f"--momentum {args.momentum}; expected a number in [0, 1)")
    if args.weight_decay < 0:
        raise ValueError(f"--weight-decay {args.weight_decay}; expected >= 0")
    if args.min_lr is not None:
        if args.lr_schedule == "constant":
            raise ValueError("--min-lr is for --lr-schedule cosine or linear (constant keeps --lr)")
        if not 0.0 <= args.min_lr <= args.lr:
            raise ValueError(f"--min-lr {args.min_lr}; expected between 0 and --lr {args.lr}")
    if args.max_time is not None and not args.max_time > 0:
        raise ValueError(f"--max-time {args.max_time}; expected a positive number of seconds")
    if args.keep_last is not None and args.keep_last < 1:
        raise ValueError(
            f"--keep-last {args.keep_last}; expected >= 1 (the newest checkpoint always stays)"
        )
    if args.grad_accum > 1 and getattr(args, "plugin", None) == "auto":
        raise ValueError(
            "--grad-accum with --plugin auto, which plans one forward per step; give the "
            "whole batch as --batch-size, or choose the plugin by hand"
        )
    if args.overwrite and args.resume:
        raise ValueError("--overwrite with --resume; pass one: --overwrite starts the run anew")
    run_compile.check(args)  # --compile's plugin and backend
    tensorboard_log.check(args)  # --tensorboard: the package is installed


def make_optimizer(args: argparse.Namespace, groups: list[dict[str, Any]]) -> Any:
    from megalith.optim import HybridAdam, HybridLion, HybridSGD

    if args.optimizer == "lion":
        return HybridLion(groups, lr=args.lr, betas=betas(args))
    if args.optimizer == "sgd":
        return HybridSGD(groups, lr=args.lr, momentum=args.momentum)
    lean = getattr(args, "optim_state_dtype", "fp32")
    return HybridAdam(groups, lr=args.lr, betas=betas(args), state_dtype=lean)


def lr_factor(args: argparse.Namespace) -> Callable[[int], float]:
    """The LambdaLR factor at each step: linear warm-up over --warmup steps, then
    --lr-schedule down to --min-lr at --steps (constant: --lr throughout)."""
    floor = min_lr(args) / args.lr

    def factor(step: int) -> float:
        if step < args.warmup:
            return (step + 1) / args.warmup
        if args.lr_schedule == "constant":
            return 1.0
        t = min(1.0, (step - args.warmup) / max(1, args.steps - args.warmup))
        if args.lr_schedule == "linear":
            return floor + (1.0 - floor) * (1.0 - t)
        return floor + (1.0 - floor) * 0.5 * (1 + math.cos(math.pi * t))

    return factor


def run_name(args: argparse.Namespace, plugin: str) -> str:
    return args.name or f"{args.model}-{plugin}"


def holds_a_run(run_dir: Path) -> bool:
    return (run_dir / "metrics.jsonl").exists() or (run_dir / "checkpoints").exists()


def check_run_dir(args: argparse.Namespace, run_dir: Path) -> None:
    """ValueError when a new run would mix with an earlier one of the same name."""
    if holds_a_run(run_dir) and not args.resume and not args.overwrite:
        raise ValueError(
            f"{run_dir} already holds a run; pass --resume to continue it, --overwrite to "
            "replace it, or another --name"
        )


def clear_run_dir(run_dir: Path) -> None:
    """--overwrite: the earlier run's files go (rank 0, before anything is written)."""
    if run_dir.exists():
        shutil.rmtree(run_dir)
