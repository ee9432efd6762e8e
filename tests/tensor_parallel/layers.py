"""Each tensor-parallel layer against its plain torch counterpart, on one rank of a grid.

A check returns a list of failures (empty: equal within 1e-5 relative): the output,
the input gradient and every weight gradient, put back together from the shards.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from megalith.models.layers import InOutLinear
from megalith.tensor_parallel import (
    ColumnParallelLinear,
    RowParallelLinear,
    VocabParallelEmbedding,
    gather_full,
    vocab_parallel_cross_entropy,
)
from tests.tensor_parallel.common import check, mesh


@dataclass(frozen=True)
class LayerCase:
    layer: str  # column, row, embedding, cross_entropy
    dp: int = 1
    tp: int = 2
    sp: bool = False
    option: bool = False  # column: gather_output; row: input_is_parallel
    transposed: bool = False


def _linear(n_in: int, n_out: int, transposed: bool) -> nn.Module:
    if not transposed:
        return nn.Linear(n_in, n_out)
    layer = InOutLinear(n_in, n_out)
    nn.init.normal_(layer.weight)
    nn.init.normal_(layer.bias)
    return layer


def _grad_of(p: nn.Parameter, group) -> torch.Tensor:
    return gather_full(p.grad, group, getattr(p, "tp_spec", None))


def run(rank: int, case: LayerCase) -> list[str]:
    group = mesh(case.dp, case.tp).group("tp")
    tp, r = group.size, group.rank
    torch.manual_seed(1)
    errors: list[str] = []
    if case.layer == "cross_entropy":
        logits = torch.randn(6, 4 * tp)
        target = torch.randint(0, 4 * tp, (6,))
        target[2] = -100
        ref_in = logits.clone().requires_grad_()
        ref = F.cross_entropy(ref_in, target)
        ref.backward()
        mine = logits.chunk(tp, -1)[r].clone().requires_grad_()
        loss = vocab_parallel_cross_entropy(mine, target, group)
        loss.backward()
        check(errors, "loss", loss, ref)
        check(errors, "logits grad", mine.grad, ref_in.grad.chunk(tp, -1)[r])
        return errors
    if case.layer == "embedding":
        ref = nn.Embedding(8 * tp, 6)
        ids = torch.randint(0, 8 * tp, (2, 2 * tp))
        layer = VocabParallelEmbedding.from_embedding(ref, group, sequence_parallel=case.sp)
        up = torch.randn(2, 2 * tp, 6)
        out_ref = ref(ids)
        out_ref.backward(up)
        out = layer(ids)
        if case.sp:
            out_ref, up = out_ref.chunk(tp, 1)[r], up.chunk(tp, 1)[r]
        out.backward(up)
        check(errors, "output", out, out_ref)
        check(errors, "weight grad", _grad_of(layer.weight, group), ref.weight.grad)
        return errors
    n_in, n_out, seq = 4 * tp, 2 * tp, 2 * tp
    ref = _linear(n_in, n_out, case.transposed)
    x = torch.randn(2, seq, n_in)
    up = torch.randn(2, seq, n_out)
    x_ref = x.clone().requires_grad_()
    out_ref = ref(x_ref)
    out_ref.backward(up)
    if case.layer == "column":
        layer = ColumnParallelLinear.from_linear(
            ref, group, gather_output=case.option, sequence_parallel=case.sp
        )
        x_in = x.chunk(tp, 1)[r] if case.sp else x
        gx_ref = x_ref.grad.chunk(tp, 1)[r] if case.sp else x_ref.grad
        if not case.option:
            out_ref, up = out_ref.chunk(tp, -1)[r], up.chunk(tp, -1)[r]
    else:
        layer = RowParallelLinear.from_linear(
            ref, group, input_is_parallel=case.option, sequence_parallel=case.sp
        )
        x_in = x.chunk(tp, -1)[r] if case.option else x
        gx_ref = x_ref.grad.chunk(tp, -1)[r] if case.option else x_ref.grad
        if case.sp:
            out_ref, up = out_ref.chunk(tp, 1)[r], up.chunk(tp, 1)[r]
    x_in = x_in.clone().requires_grad_()
    out = layer(x_in)
    out.backward(up)
    check(errors, "output", out, out_ref)
    check(errors, "input grad", x_in.grad, gx_ref)
    check(errors, "weight grad", _grad_of(layer.weight, group), ref.weight.grad)
    check(errors, "bias grad", _grad_of(layer.bias, group), ref.bias.grad)
    return errors
