"""Ranks of test_train_pipeline: `megalith train --plugin auto` with a pipeline fixed in
its plan, in-process; and the plain single-process torch run of the same steps."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from tests.cli.train_worker import args, losses

#: 4 steps of 4 sequences of 32 tokens per rank; evaluation and the checkpoint at step 4
WORDS = ["--plugin", "auto", "--steps", "4", "--eval-every", "4", "--save-every", "4"]


def pipelined_run(rank: int, setting: tuple[str, str, int]) -> dict[str, Any] | None:
    """Trains with --plan-fix `fix` under runs `root`/NAME; rank 0: losses and plan.json."""
    from megalith.train.loop import train

    fix, root, seed = setting
    train(args(*WORDS, "--plan-fix", fix, "--seed", str(seed), "--out", root, "--name", "pp"))
    if rank != 0:
        return None
    run = Path(root) / "pp"
    return {"losses": losses(run), "plan": json.loads((run / "plan.json").read_text())}


def plain_losses(seed: int, dp: int) -> list[tuple[int, float]]:
    """The same steps in one process with plain torch: each step the dp ranks' batches in
    one forward (their mean loss), clipped to --max-norm, the same optimizer and schedule."""
    from megalith import models
    from megalith.train import choices, tokenize
    from megalith.train import corpus as text
    from megalith.train.loop import _param_groups

    a = args(*WORDS, "--seed", str(seed))
    torch.manual_seed(a.seed)
    data = text.load(a.data, 20 * (a.seq_len + 1), tokenize.load(a.tokenizer), a.text_field)
    model = models.create(a.model, device="cpu", seed=a.seed, vocab_size=data.vocab)
    opt = choices.make_optimizer(a, _param_groups(model, a.weight_decay))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, choices.lr_factor(a))
    per_rank = a.batch_size * 4 // dp  # the 4-rank run's share of each dp rank
    out = []
    for step in range(1, a.steps + 1):
        ids = torch.cat(
            [
                text.batch(
                    data.train, per_rank, a.seq_len, text.batch_generator(a.seed, step, r, "train")
                )
                for r in range(dp)
            ]
        )
        loss = model(ids, labels=ids)[0]
        loss.backward()
        if a.max_norm:
            torch.nn.utils.clip_grad_norm_(model.parameters(), a.max_norm)
        opt.step()
        opt.zero_grad()
        sched.step()
        out.append((step, float(loss.detach())))
    return out
