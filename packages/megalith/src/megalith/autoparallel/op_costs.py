"""What one aten op costs: its kind, FLOPs and bytes, from the shapes of its tensors.

FLOPs: a multiply-add is 2 FLOPs. mm / addmm: 2*m*n*k (addmm's bias add is not counted);
bmm / baddbmm: 2*b*m*n*k; convolution: 2 * output elements * in_channels/groups * kernel
size; fused attention: 2*b*h*s_q*s_k*(d_qk + d_v), the score product and the weighted
sum, with no discount for a causal mask (as megalith.models.counting and the MFU
convention count it). Other ops: one FLOP per output element (elementwise) or per input
element (reductions, norms, softmax, the loss).

Bytes: every tensor the op reads plus every tensor it writes, at its own dtype. Views
(transpose, view, expand, slicing) move nothing and cost nothing. An embedding lookup
reads the rows it gathers (as many as it writes), not the whole table.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch.utils._pytree import tree_leaves

MATMUL_OPS = {"mm", "addmm", "bmm", "baddbmm", "convolution", "_convolution"}
ATTENTION_OPS = {
    "_scaled_dot_product_flash_attention",
    "_scaled_dot_product_flash_attention_for_cpu",
    "_scaled_dot_product_efficient_attention",
    "_scaled_dot_product_cudnn_attention",
    "_scaled_dot_product_fused_attention_overrideable",
    "_flash_attention_forward",
    "_efficient_attention_forward",
}
EMBEDDING_OPS = {"embedding", "_embedding_bag"}
REDUCTION_WORDS = ("norm", "softmax", "sum", "mean", "var", "std", "amax", "amin", "max", "min")
LOSS_WORDS = ("nll_loss", "cross_entropy", "mse_loss", "binary_cross_entropy")


def tensors(tree: Any) -> list[torch.Tensor]:
    return [t for t in tree_leaves(tree) if isinstance(t, torch.Tensor)]


def nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def base_name(func: Any) -> str:
    """aten.addmm.default -> addmm."""
    return func._schema.name.split("::")[-1]


def is_view(func: Any) -> bool:
    return bool(getattr(func, "is_view", False))


def matmul_shape(name: str, args: tuple) -> tuple[int, int, int, int]:
    """(batch, m, n, k) of a matmul-kind op."""
    if name == "mm":
        (m, k), n = args[0].shape, args[1].shape[-1]
        return 1, m, n, k
    if name == "addmm":
        (m, k), n = args[1].shape, args[2].shape[-1]
        return 1, m, n, k
    a, b = (args[0], args[1]) if name == "bmm" else (args[1], args[2])
    return a.shape[0], a.shape[1], b.shape[2], a.shape[2]


def conv_flops(args: tuple, out: torch.Tensor) -> tuple[int, int, int, int]:
    """(flops, m, n, k) of a convolution as the matmul it is: m output positions,
    n output channels, k = in_channels/groups * kernel size."""
    weight = args[1]
    k = math.prod(weight.shape[1:])
    n = weight.shape[0]
    m = out.numel() // n
    return 2 * m * n * k, m, n, k


def attention_flops(args: tuple) -> tuple[int, int, int, int]:
    """(flops, s_q, s_k, d_qk + d_v) of fused attention over q, k, v [b, h, s, d]."""
    q, k, v = args[0], args[1], args[2]
    batch_heads = math.prod(q.shape[:-2])
    s_q, s_k = q.shape[-2], k.shape[-2]
    d = q.shape[-1] + v.shape[-1]
    return 2 * batch_heads * s_q * s_k * d, s_q, s_k, d


def classify(name: str) -> str:
    if name in MATMUL_OPS:
        return "matmul"
    if name in ATTENTION_OPS:
        return "attention"
    if name in EMBEDDING_OPS:
        return "embedding"
    if any(w in name for w in LOSS_WORDS) or any(w in name for w in REDUCTION_WORDS):
        return "reduction"
    return "elementwise"


def op_cost(func: Any, args: tuple, kwargs: dict, out: Any) -> dict[str, Any] | None:
    """{kind, flops, bytes, m, n, k} of one op, or None for a view (it costs nothing)."""
    if is_view(func):
        return None
    name = base_name(func)
    inputs, outputs = tensors((args, kwargs)), tensors(out)
    written = sum(nbytes(t) for t in outputs)
    read = sum(nbytes(t) for t in inputs)
    kind = classify(name)
    m = n = k = 0
    if kind == "matmul" and name in ("convolution", "_convolution"):
        flops, m, n, k = conv_flops(args, outputs[0])
    elif kind == "matmul":
        batch, m, n, k = matmul_shape(name, args)
        flops, m = 2 * batch * m * n * k, batch * m
    elif kind == "attention":
        flops, m, n, k = attention_flops(args)
    elif kind == "embedding":
        flops, read = 0, written + sum(nbytes(t) for t in inputs[1:2])
    elif kind == "reduction":
        flops = sum(t.numel() for t in inputs if t.is_floating_point())
    else:
        flops = sum(t.numel() for t in outputs if t.is_floating_point())
    if not inputs and not outputs:
        return None
    return {"kind": kind, "flops": int(flops), "bytes": int(read + written), "m": m, "n": n, "k": k}
