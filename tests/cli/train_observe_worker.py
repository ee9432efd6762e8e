"""Ranks of tests/cli/test_train_observe.py: the `megalith train` loop in-process, eager
(with --tensorboard) and with --compile under DDP and ZeRO-2."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from megalith import models
from megalith.train import mfu
from megalith.train.loop import train
from tests.cli.train_worker import args

RUNS = {  # name: options; aot_eager traces autograd as inductor does, without its codegen
    "eager": ["--plugin", "ddp", "--tensorboard"],
    "compiled-ddp": ["--plugin", "ddp", "--compile", "aot_eager"],
    "compiled-zero2": ["--plugin", "zero2", "--compile", "aot_eager"],
}


def _rows(run_dir: Path) -> list[dict]:
    return [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]


def eager_and_compiled(rank: int, root: str):
    """Each run's metrics.jsonl rows, and gpt-tiny's traced FLOPs per token beside 6 N."""
    common = ["--steps", "3", "--eval-every", "2", "--save-every", "100", "--out", root]
    for name, words in RUNS.items():  # dynamo's cache serves the second compile
        train(args(*common, "--name", name, *words))
    if rank != 0:
        return None
    model = models.create("gpt-tiny", device=torch.device("cpu"), vocab_size=256)
    traced = mfu.flops_per_token(model, 32, "fp32")
    return {name: _rows(Path(root) / name) for name in RUNS}, traced, models.num_parameters(model)
