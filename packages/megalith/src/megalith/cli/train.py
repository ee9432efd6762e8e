"""`megalith train`: train a small GPT on the built-in corpus (or your text), on every
local GPU or on 2 CPU ranks, with a progress bar, metrics, a plot and checkpoints.

    megalith train                                  # gpt-tiny, DDP, built-in Shakespeare
    megalith train --plugin zero2 --steps 1000      # ZeRO stage 2
    megalith train --plugin auto                    # the planner chooses (runs/NAME/plan.json)
    megalith train --resume                         # continue this run from its last checkpoint
    megalith train --grad-accum 4 --optimizer lion --lr 3e-4 --lr-schedule linear
    megalith train --config run.toml --steps 50     # options from a TOML file; the CLI wins
    megalith train --max-time 3600 --keep-last 2    # an hour, the two newest checkpoints
    megalith train --overwrite                      # this run's name again, from nothing
    megalith train --from-pretrained ckpt/llama --tokenizer ckpt/llama --lora 8
                                                    # LoRA on a transformers checkpoint
    megalith train --compile --tensorboard          # torch.compile; TensorBoard events too

Without RANK in the environment it starts the ranks itself through `megalith run`
(--nproc, default one per GPU or 2 CPU ranks); each rank runs `python -m megalith.train`.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    from megalith.train.config import ConfigParser
    from megalith.train.options import add_options

    parser = subparsers.add_parser(
        "train",
        help="train a small GPT on the built-in corpus",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    # --config is read before the rest (ConfigParser adds behaviour only, no state)
    parser.__class__ = ConfigParser
    add_options(parser)
    parser.set_defaults(func=run)
    return parser


def _ranks(nproc: int | None) -> int:
    if nproc is not None:
        if nproc < 1:
            raise SystemExit(f"megalith train: --nproc {nproc}; expected >= 1")
        return nproc
    import torch

    return torch.cuda.device_count() or 2


def run(args: argparse.Namespace) -> int:
    if "RANK" in os.environ:  # already a rank (torchrun, megalith run)
        from megalith.train.loop import train

        return train(args)
    from megalith.cli.main import main
    from megalith.strategy import Strategy
    from megalith.testing.spawn import free_port
    from megalith.train import auto, choices, finetune
    from megalith.train.options import to_argv

    try:  # once, here, before any rank starts (the ranks check again)
        finetune.resolve_model(args)
        if auto.is_auto(args):
            auto.check_args(args)
            plugin = "auto"
        else:
            plugin = Strategy.from_cli(args).plugin
        choices.check(args)
        finetune.check(args)
        choices.check_run_dir(args, Path(args.out) / choices.run_name(args, plugin))
    except ValueError as e:
        raise SystemExit(f"megalith train: {e}") from None
    nproc = _ranks(args.nproc)
    return main(
        [
            "run",
            "--nproc_per_node",
            str(nproc),
            "--master_port",
            str(free_port()),
            "-m",
            "megalith.train",
            *to_argv(args),
        ]
    )
