"""Cross-entropy over vocabulary-parallel logits, never gathering the full logits.

Each rank holds logits[..., start:end]. Three all-reduces of one number per token
(the max, the sum of exponentials, the target's logit) give the exact loss; the
backward is softmax - one_hot on the local slice, with no communication.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

import megalith_comm as comm
from megalith_comm import ProcessGroup

IGNORE_INDEX = -100


class _VocabParallelCE(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, target, group, ignore_index):
        logits = logits.float()
        vocab_local = logits.shape[-1]
        start = group.rank * vocab_local
        top = logits.max(dim=-1).values
        comm.all_reduce(top, op="max", group=group)
        shifted = logits - top.unsqueeze(-1)
        exp = shifted.exp()
        sum_exp = exp.sum(dim=-1)
        comm.all_reduce(sum_exp, group=group)
        ignored = target == ignore_index
        local_t = target - start
        mine = (local_t >= 0) & (local_t < vocab_local) & ~ignored
        safe_t = local_t.masked_fill(~mine, 0)
        picked = shifted.gather(-1, safe_t.unsqueeze(-1)).squeeze(-1).masked_fill(~mine, 0.0)
        comm.all_reduce(picked, group=group)
        loss = (sum_exp.log() - picked).masked_fill(ignored, 0.0)
        softmax = exp / sum_exp.unsqueeze(-1)
        ctx.save_for_backward(softmax, safe_t, mine, ignored)
        return loss

    @staticmethod
    def backward(ctx, grad):
        softmax, safe_t, mine, ignored = ctx.saved_tensors
        g = softmax - F.one_hot(safe_t, softmax.shape[-1]).to(softmax.dtype) * mine.unsqueeze(-1)
        g = g * grad.masked_fill(ignored, 0.0).unsqueeze(-1)
        return g, None, None, None


def vocab_parallel_cross_entropy(
    logits: torch.Tensor,
    target: torch.Tensor,
    group: ProcessGroup,
    ignore_index: int = IGNORE_INDEX,
    reduction: str = "mean",
) -> torch.Tensor:
    """F.cross_entropy(full_logits, target) from this rank's vocabulary slice, in fp32.

    logits: [..., vocab / tp] (rank r holds vocabulary rows [r * v, (r + 1) * v));
    target: [...] int64 over the full vocabulary. reduction: "mean" (over targets
    not equal to ignore_index), "sum" or "none".
    """
    if logits.shape[:-1] != target.shape:
        raise ValueError(
            f"logits {tuple(logits.shape)} need targets of shape {tuple(logits.shape[:-1])}, "
            f"got {tuple(target.shape)}"
        )
    loss = _VocabParallelCE.apply(logits, target, group, ignore_index)
    if reduction == "none":
        return loss
    if reduction == "sum":
        return loss.sum()
    return loss.sum() / (target != ignore_index).sum().clamp_min(1)


def vocab_parallel_causal_lm_loss(
    logits: torch.Tensor,
    labels: torch.Tensor,
    group: ProcessGroup,
    ignore_index: int = IGNORE_INDEX,
) -> torch.Tensor:
    """megalith.models.causal_lm_loss (logits at t predict labels at t + 1) on vocab shards."""
    targets = F.pad(labels[:, 1:], (0, 1), value=ignore_index).to(logits.device)
    return vocab_parallel_cross_entropy(logits, targets, group, ignore_index)
