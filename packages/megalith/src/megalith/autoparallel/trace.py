"""One forward recorded op by op: every aten op's cost, the part of the model that ran
it, the parameters it first read, and the tensors autograd saved for backward.

The model is cut into parts: 0 is "pre", 1..n the repeated blocks, n+1 "post". A part
is a set of the model's modules (a block may hold several, as T5's bridge between
encoder and decoder does). Parts run in order: when a module of a later part starts,
the trace moves on to it, and never back (T5's shared embedding belongs to "pre" and to
the bridge; the first use is the encoder's, the second the decoder's). Ops outside
every part's modules belong to the part the trace is in; after the last block's
modules return, the trace is in "post".

Saved tensors count by storage, once (q, k and v of one fused projection are one
storage; an input saved by three linears is saved once), and never a parameter's.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from .op_costs import nbytes, op_cost, tensors
from .types import OpRecord


def storage_key(t: torch.Tensor) -> int:
    """The identity of the memory a tensor lives in (shared by all its views)."""
    return t.untyped_storage()._cdata


@dataclass
class PartTally:
    ops: list[OpRecord] = field(default_factory=list)
    params: int = 0
    tp_params: int = 0
    activation_bytes: int = 0
    boundary_bytes: int = 0
    tp_allreduce_bytes: int = 0
    attention_io_bytes: int = 0
    param_tensors: int = 0


class FusedAttentionOnMeta(TorchFunctionMode):
    """On the meta device torch's SDPA falls back to its math path (a [s, s] score
    matrix saved for backward), which no GPU or CPU run takes. Route it to the fused
    kernel the CPU picks, whose saved tensors (q, k, v, out, logsumexp) are those of
    the GPU's flash kernel too."""

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: Any = None):
        kwargs = kwargs or {}
        if func is not F.scaled_dot_product_attention or not args[0].is_meta:
            return func(*args, **kwargs)
        return _fused_sdpa(*args, **kwargs)


def _fused_sdpa(
    q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False
):
    if k.shape[-3] != q.shape[-3]:  # grouped-query attention: one kv head per query group
        repeat = q.shape[-3] // k.shape[-3]
        k, v = k.repeat_interleave(repeat, dim=-3), v.repeat_interleave(repeat, dim=-3)
    if attn_mask is not None and attn_mask.requires_grad:
        # A learned bias (T5's relative positions): the memory-efficient kernel, the one
        # fused kernel that returns the bias's gradient.
        out = torch.ops.aten._scaled_dot_product_efficient_attention(
            q, k, v, attn_mask, True, dropout_p, is_causal, scale=scale
        )[0]
        return out
    out, _ = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
        q, k, v, dropout_p, is_causal, attn_mask=attn_mask, scale=scale
    )
    return out


class ForwardTrace(TorchDispatchMode):
    """Records one forward of `model` (enter it, run the forward, read `parts`)."""

    def __init__(
        self,
        model: nn.Module,
        parts: list[list[nn.Module]],
        tp_sharded: frozenset[str],
        all_reduced: frozenset[str],
    ) -> None:
        super().__init__()
        self.parts = [PartTally() for _ in parts]
        self.current = 0
        self.last_block = len(parts) - 2
        self.part_of: dict[int, list[int]] = {}
        for index, modules in enumerate(parts):
            for m in modules:
                self.part_of.setdefault(id(m), []).append(index)
        self.last_block_modules = {id(m) for m in parts[self.last_block]}
        self.stack: list[str] = []
        self.names = {id(m): name for name, m in model.named_modules()}
        self.all_reduced = {id(m) for p, m in model.named_modules() if p in all_reduced}
        self.first_block_input = 0
        self.params: dict[int, tuple[int, bool]] = {}  # storage -> (numel, tp sharded)
        for name, p in model.named_parameters(remove_duplicate=False):
            numel, sharded = self.params.get(storage_key(p), (p.numel(), False))
            self.params[storage_key(p)] = (numel, sharded or name in tp_sharded)
        self.saved: set[int] = set()
        self.handles = [
            handle
            for m in model.modules()
            for handle in (
                m.register_forward_pre_hook(self._enter),
                m.register_forward_hook(self._exit, always_call=True),
            )
        ]

    # -- modules -------------------------------------------------------------
    def _enter(self, module: nn.Module, args: tuple) -> None:
        self.stack.append(self.names.get(id(module), ""))
        later = [i for i in self.part_of.get(id(module), ()) if i >= self.current]
        if later:
            if min(later) == 1 and self.current == 0:
                self.first_block_input = sum(nbytes(t) for t in tensors(args)[:1])
            self.current = min(later)

    def _exit(self, module: nn.Module, args: tuple, output: Any) -> None:
        self.stack.pop()
        tally = self.parts[self.current]
        if id(module) in self.all_reduced:
            tally.tp_allreduce_bytes += sum(nbytes(t) for t in tensors(output))
        if self.current in self.part_of.get(id(module), ()):
            tally.boundary_bytes = sum(nbytes(t) for t in tensors(output))
        if id(module) in self.last_block_modules and self.current == self.last_block:
            self.current = self.last_block + 1

    # -- ops -----------------------------------------------------------------
    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: Any = None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        tally = self.parts[self.current]
        for t in tensors((args, kwargs)):
            found = self.params.pop(storage_key(t), None) if t.is_floating_point() else None
            if found is not None:
                tally.params += found[0]
                tally.tp_params += found[0] if found[1] else 0
                tally.param_tensors += 1
        cost = op_cost(func, args, kwargs, out)
        if cost is not None and cost["kind"] == "attention":
            # q, k, v (FusedAttentionOnMeta repeated grouped kv heads to q's, as Ulysses
            # does before its exchange) and the output; not the mask or logsumexp
            tally.attention_io_bytes += sum(nbytes(t) for t in args[:3])
            tally.attention_io_bytes += nbytes(tensors(out)[0])
        if cost is not None:
            module = self.stack[-1] if self.stack else ""
            tally.ops.append(OpRecord(module=module, op=str(func), **cost))
        return out

    def pack(self, t: torch.Tensor) -> torch.Tensor:
        key = storage_key(t)
        if key not in self.saved and key not in self._param_keys:
            self.saved.add(key)
            self.parts[self.current].activation_bytes += t.untyped_storage().nbytes()
        return t

    def run(self, forward: Callable[[], Any]) -> Any:
        """forward() under the trace; the hooks are removed afterwards."""
        self._param_keys = set(self.params)
        try:
            with torch.autograd.graph.saved_tensors_hooks(self.pack, lambda t: t):
                with FusedAttentionOnMeta(), self:
                    out = forward()
        finally:
            for handle in self.handles:
                handle.remove()
        # Parameters no op read (an unused pooler, say) still take memory: the head's.
        for numel, sharded in self.params.values():
            self.parts[-1].params += numel
            self.parts[-1].tp_params += numel if sharded else 0
        self.parts[0].boundary_bytes = self.parts[0].boundary_bytes or self.first_block_input
        return out
