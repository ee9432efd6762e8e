"""The options of `megalith train` (argparse), shared by the CLI and the ranks: the
strategy options of megalith.cli.options (also `megalith plan`'s) and the run's own."""

from __future__ import annotations

import argparse

from megalith.cli.options import add_strategy_options

from . import finetune


def add_options(p: argparse.ArgumentParser) -> None:
    add_strategy_options(
        p,
        plugin="ddp",
        precision=None,
        precision_help="default: bf16 on GPUs, fp32 on CPU ranks",
        auto=True,
    )
    p.add_argument(
        "--model",
        default=None,
        help="a megalith.models preset (gpt-tiny ... llama-7b; default: gpt-tiny, or with "
        "--from-pretrained the checkpoint's own)",
    )
    p.add_argument("--steps", type=int, default=400, help="optimizer steps in all (default: 400)")
    p.add_argument(
        "--batch-size", type=int, default=16, help="sequences per rank per step (default: 16)"
    )
    p.add_argument(
        "--seq-len", type=int, default=128, help="tokens (bytes) per sequence (default: 128)"
    )
    p.add_argument("--lr", type=float, default=2e-3, help="peak learning rate (default: 2e-3)")
    p.add_argument("--warmup", type=int, default=30, help="warm-up steps (default: 30)")
    p.add_argument(
        "--lr-schedule",
        choices=("cosine", "linear", "constant"),
        default="cosine",
        help="after the warm-up, down to --min-lr at --steps (default: cosine)",
    )
    p.add_argument("--min-lr", type=float, default=None, help="default: a tenth of --lr")
    p.add_argument(
        "--optimizer", choices=("adamw", "lion", "sgd"), default="adamw", help="default: adamw"
    )
    p.add_argument(
        "--optim-state-dtype",
        choices=("fp32", "bf16", "int8"),
        default="fp32",
        help="adamw's exp_avg and exp_avg_sq: fp32 (default, exact), bf16 (stochastic "
        "rounding) or int8 (block-quantised, 256 per scale)",
    )
    p.add_argument(
        "--betas", default=None, help="B1,B2 of adamw (default 0.9,0.95) or lion (0.9,0.99)"
    )
    p.add_argument("--momentum", type=float, default=0.9, help="sgd's momentum (default: 0.9)")
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument(
        "--grad-accum",
        type=int,
        default=1,
        help="micro-batches of --batch-size per optimizer step (default: 1)",
    )
    p.add_argument(
        "--max-norm", type=float, default=1.0, help="clip gradients to this global norm (0: off)"
    )
    p.add_argument(
        "--data", default=None, help="a text file or folder (default: the built-in Shakespeare)"
    )
    p.add_argument("--name", default=None, help="run name (default: <model>-<plugin>)")
    p.add_argument("--out", default="runs", help="where runs go (default: ./runs)")
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="a run of this name exists: remove it and start anew (else: --resume)",
    )
    p.add_argument(
        "--config",
        default=None,
        help="a TOML file of options (keys: the option names); the command line overrides it",
    )
    p.add_argument(
        "--resume",
        default=None,
        nargs="?",
        const="auto",
        help="resume from a checkpoint dir, or (no value) from this run's latest",
    )
    p.add_argument(
        "--save-every",
        type=int,
        default=200,
        help="checkpoint every N steps (and at the end); 0: no checkpoints",
    )
    p.add_argument(
        "--sync-save",
        action="store_true",
        help="write checkpoints in the step (default: in the background, after a copy to host)",
    )
    p.add_argument(
        "--eval-every", type=int, default=100, help="validation every N steps (and at the end)"
    )
    p.add_argument("--keep-last", type=int, default=None, help="keep only the newest N checkpoints")
    p.add_argument(
        "--max-time",
        type=float,
        default=None,
        help="stop (and save) at the first step boundary after SECONDS of training",
    )
    p.add_argument("--eval-batches", type=int, default=8)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--activation-checkpointing", action="store_true")
    p.add_argument(
        "--compile",
        nargs="?",
        const="inductor",
        default=None,
        metavar="BACKEND",
        help="torch.compile the model (plugins ddp, zero1, zero2); BACKEND inductor "
        "(default), aot_eager or eager",
    )
    p.add_argument(
        "--tensorboard",
        action="store_true",
        help="also write TensorBoard event files under runs/NAME/tensorboard/ "
        "(needs: pip install tensorboard)",
    )
    p.add_argument(
        "--plan-fix",
        default=None,
        metavar="KNOB=VALUE[,...]",
        help="--plugin auto: fix knobs of the plan (dp, tp, pp, sp, zero_stage, "
        "num_microbatches, ckpt, schedule, ...), e.g. pp=2,schedule=zbv",
    )
    p.add_argument(
        "--stop-after", type=int, default=None, help=argparse.SUPPRESS
    )  # tests: stop as if killed
    p.add_argument(
        "--nproc",
        type=int,
        default=None,
        help="ranks to start (default: one per GPU, or 2 CPU ranks without a GPU)",
    )
    finetune.add_options(p)


_NOT_RANK_OPTIONS = {
    "func", "command", "nproc", "cmake_dir", "include_dir", "version", "config"
}  # fmt: skip


def to_argv(args: argparse.Namespace) -> list[str]:
    """The options again as command-line words, for the ranks the launcher starts."""
    out: list[str] = []
    for key, value in vars(args).items():
        if key in _NOT_RANK_OPTIONS or value is None or value is False:
            continue
        flag = "--" + key.replace("_", "-")
        out += [flag] if value is True else [flag, str(value)]
    return out
