"""analyze(model, seq_len): a model's costs from one forward traced on the meta device.

    analysis = analyze(megalith.models.create("llama-70b"), seq_len=4096)   # seconds
    analysis.blocks[0].fwd_flops, analysis.blocks[0].activation_bytes

Nothing is allocated: the model is copied onto the meta device at the training
precision (a model already on meta is copied too, never changed), and one forward of a
1 x seq_len batch, loss included, runs under a dispatch mode that records every aten op
(op_costs.py prices them), module hooks that say which part ran it, and autograd's
saved-tensor hooks that measure what backward will need (trace.py). The parts are the
pipeline's legal cuts (model_parts.py); what tensor parallelism shards is learned from
the family's policy run on a meta copy (tp_shards.py). No per-model formulas.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from .model_parts import forward_inputs, model_parts, model_sizes, training_loss
from .tp_shards import tp_layout
from .trace import ForwardTrace, PartTally
from .types import BlockCost, ModelAnalysis

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def meta_copy(model: nn.Module, dtype: torch.dtype) -> nn.Module:
    """A copy of model on the meta device whose floating-point parameters and buffers
    are `dtype` (as model.to(dtype) would make them); real weights are never copied,
    and tied parameters stay tied."""

    def like(t: torch.Tensor) -> torch.Tensor:
        return torch.empty_like(t, device="meta", dtype=dtype if t.is_floating_point() else None)

    memo: dict[int, object] = {}
    for p in model.parameters():
        memo[id(p)] = nn.Parameter(like(p), requires_grad=p.requires_grad)
    for b in model.buffers():
        memo[id(b)] = like(b)
    return copy.deepcopy(model, memo)


def _cost(name: str, tally: PartTally) -> BlockCost:
    ops = tuple(tally.ops)
    matmul = sum(op.flops for op in ops if op.kind == "matmul")
    attention = sum(op.flops for op in ops if op.kind == "attention")
    return BlockCost(
        name=name,
        fwd_flops=sum(op.flops for op in ops),
        fwd_bytes=sum(op.bytes for op in ops),
        matmul_flops=matmul,
        attention_flops=attention,
        params=tally.params,
        tp_params=tally.tp_params,
        activation_bytes=tally.activation_bytes,
        boundary_bytes=tally.boundary_bytes,
        tp_allreduce_bytes=tally.tp_allreduce_bytes,
        ops=ops,
        attention_io_bytes=tally.attention_io_bytes,
        param_tensors=tally.param_tensors,
    )


def _part_name(model: nn.Module, modules: list[nn.Module], fallback: str) -> str:
    names = {id(m): name for name, m in model.named_modules()}
    found = [names[id(m)] for m in modules if id(m) in names]
    return ",".join(found) or fallback


def analyze(
    model: nn.Module, seq_len: int, *, precision: str = "bf16", name: str | None = None
) -> ModelAnalysis:
    """The per-block costs of one sequence of seq_len tokens through `model` in training
    (forward with the loss; backward costs follow from them in the cost model)."""
    if precision not in DTYPES:
        raise ValueError(f"precision must be one of {sorted(DTYPES)}, got {precision!r}")
    if seq_len < 1:
        raise ValueError(f"seq_len must be positive, got {seq_len}")
    shadow = meta_copy(model, DTYPES[precision])
    shadow.train()
    parts = model_parts(shadow)
    layout = tp_layout(shadow)
    trace = ForwardTrace(shadow, parts, layout.sharded, layout.all_reduced)
    inputs = forward_inputs(shadow, seq_len)
    with torch.enable_grad():
        trace.run(lambda: training_loss(shadow(**inputs), seq_len))
    names = [_part_name(shadow, p, f"block{i}") for i, p in enumerate(parts[1:-1])]
    blocks = tuple(_cost(n, t) for n, t in zip(names, trace.parts[1:-1], strict=True))
    config = getattr(model, "config", None)
    label = name or getattr(config, "name", None) or type(model).__name__
    return ModelAnalysis(
        model=label if isinstance(label, str) else type(model).__name__,
        family=layout.policy,
        seq_len=seq_len,
        param_dtype=precision,
        params=sum(t.params for t in trace.parts),
        pre=_cost("pre", trace.parts[0]),
        blocks=blocks,
        post=_cost("post", trace.parts[-1]),
        **model_sizes(shadow, len(blocks)),
    )
