"""The train loop's steps for a model cut into pipeline stages (HybridParallelPlugin with
pp_size > 1, which `--plugin auto` picks when the planner's plan has pp > 1).

Training runs each --grad-accum slice of the rank's batch through
booster.execute_pipeline (every slice but the last under booster.no_sync, so gradients
are reduced once a step); the plugin splits a slice into the plan's micro-batches.
Validation is the pipeline's forward-only loss (Pipeline.eval_step, in as many
micro-batches of the validation batch as the plan has, or fewer when they do not
divide it). Sampling text needs the whole model on one rank and is skipped.
"""

from __future__ import annotations

from contextlib import nullcontext
from typing import Any

import torch


def is_pipelined(model: Any) -> bool:
    """Whether the boosted model runs through booster.execute_pipeline."""
    from megalith.booster.plugin.hybrid_pipeline import PipelineModel

    return isinstance(model, PipelineModel)


def _lm_loss(outputs: Any, _batch: Any) -> torch.Tensor:
    return outputs.loss


def train_step(booster: Any, model: Any, optimizer: Any, ids: torch.Tensor, accum: int) -> Any:
    """Forward and backward of the rank's batch `ids` (accum equal slices); the batch's
    mean loss (a float64 CPU tensor, the mean of the slices' means)."""
    logged = torch.zeros((), dtype=torch.float64)
    for i, micro in enumerate(ids.chunk(accum)):
        sync = nullcontext() if i == accum - 1 else booster.no_sync(model, optimizer)
        with sync:
            out = booster.execute_pipeline(
                iter([{"input_ids": micro, "labels": micro}]), model, _lm_loss, optimizer
            )
        logged += out["loss"].detach().double().cpu() / accum
    return logged


def eval_loss(model: Any, ids: torch.Tensor) -> float:
    """The mean causal-LM loss of `ids` through the stages, forward only (every rank)."""
    from megalith.booster.plugin.hybrid_pipeline import loss_fn_for

    pipe = model.pipe
    rows = ids.shape[0]
    planned = model.settings.num_microbatches or 1
    count = max(m for m in range(1, min(planned, rows) + 1) if rows % m == 0)
    before = pipe.num_microbatches
    pipe.set_num_microbatches(count)
    pipe.loss_fn = pipe.executor.loss_fn = loss_fn_for(_lm_loss, 1.0, None, model.logits_group)
    try:
        with model.autocast():
            loss = pipe.eval_step(ids, {"input_ids": ids, "labels": ids})
    finally:
        pipe.set_num_microbatches(before)
    return float(loss)
