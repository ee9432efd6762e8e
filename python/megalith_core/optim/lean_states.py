"""Adam's state formats: names, allocation, and conversion between them.

The formats and their rules are [Note: lean states] in
core/include/megalith/optim/slots.h. The step kernels apply the rules in their
one pass; this module does whole-tensor conversions (a checkpoint of one format
loaded into an optimizer of another) with the same fp32 arithmetic, so an fp32
state quantised here gets the codes the kernel would have written.

Bytes per parameter of Adam's two states: fp32 8, bf16 4, int8 2 + 8/256.
"""

from __future__ import annotations

from typing import Any

import torch

#: the names users pass as ``state_dtype``
STATE_DTYPES = ("fp32", "bf16", "int8")
#: the names users pass as ``master_dtype``
MASTER_DTYPES = ("fp32", "bf16")
#: elements per q8 block (the engine's kQ8Block)
Q8_BLOCK = 256
#: the extra per-parameter state tensors of the int8 format
SCALE_NAMES = ("exp_avg_scale", "exp_avg_sq_scale")

_INV_127_SQ = torch.tensor(1.0 / 16129.0, dtype=torch.float32)
_INV_255_SQ = torch.tensor(1.0 / 65025.0, dtype=torch.float32)


def check_state_dtype(owner: str, state_dtype: str) -> str:
    if state_dtype not in STATE_DTYPES:
        raise ValueError(
            f"{owner}: state_dtype={state_dtype!r}; expected one of {', '.join(STATE_DTYPES)}"
        )
    return state_dtype


def check_master_dtype(owner: str, master_dtype: str) -> str:
    if master_dtype not in MASTER_DTYPES:
        raise ValueError(
            f"{owner}: master_dtype={master_dtype!r}; expected one of {', '.join(MASTER_DTYPES)}"
        )
    return master_dtype


def blocks(numel: int) -> int:
    """q8 scales a tensor of `numel` elements needs."""
    return -(-numel // Q8_BLOCK)


def format_of(state: dict[str, Any]) -> str:
    """The format a per-parameter state holds, from its exp_avg's dtype."""
    dtype = state["exp_avg"].dtype
    if dtype == torch.int8 or "exp_avg_scale" in state:
        return "int8"
    if dtype == torch.bfloat16:
        return "bf16"
    return "fp32"


def new_states(p: torch.Tensor, state_dtype: str) -> dict[str, torch.Tensor]:
    """Zero Adam states of `p` in the given format (the fresh-optimizer state)."""
    if state_dtype == "fp32":
        dtypes = (torch.float32, torch.float32)
    elif state_dtype == "bf16":
        dtypes = (torch.bfloat16, torch.bfloat16)
    else:
        dtypes = (torch.int8, torch.uint8)
    out = {
        "exp_avg": torch.zeros(p.shape, dtype=dtypes[0], device=p.device),
        "exp_avg_sq": torch.zeros(p.shape, dtype=dtypes[1], device=p.device),
    }
    if state_dtype == "int8":
        for name in SCALE_NAMES:
            out[name] = torch.zeros(blocks(p.numel()), dtype=torch.float32, device=p.device)
    return out


def _blocked(x: torch.Tensor) -> torch.Tensor:
    flat = x.reshape(-1)
    pad = blocks(flat.numel()) * Q8_BLOCK - flat.numel()
    return torch.nn.functional.pad(flat, (0, pad)).view(-1, Q8_BLOCK)


def quantize(m: torch.Tensor, v: torch.Tensor) -> dict[str, torch.Tensor]:
    """fp32 m and v -> int8/uint8 codes and their block scales (the q8 rule)."""
    m = m.float()
    v = v.float()
    mb, vb = _blocked(m), _blocked(v)
    a = mb.abs().amax(dim=1)
    u = vb.amax(dim=1).sqrt()
    inv_a = torch.where(a > 0, 1.0 / torch.where(a > 0, a, 1.0), 0.0).unsqueeze(1)
    inv_u = torch.where(u > 0, 1.0 / torch.where(u > 0, u, 1.0), 0.0).unsqueeze(1)
    cm = torch.round((mb.abs() * inv_a).sqrt() * 127.0).clamp(max=127.0) * torch.sign(mb)
    cv = torch.round((vb.sqrt() * inv_u).sqrt() * 255.0).clamp(max=255.0)
    n = m.numel()
    return {
        "exp_avg": cm.reshape(-1)[:n].to(torch.int8).view(m.shape),
        "exp_avg_sq": cv.reshape(-1)[:n].to(torch.uint8).view(v.shape),
        "exp_avg_scale": a,
        "exp_avg_sq_scale": u,
    }


def dequantize(state: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
    """int8/uint8 codes and scales -> fp32 m and v (the q8 rule's decode)."""
    c, q = state["exp_avg"], state["exp_avg_sq"]
    shape, n = c.shape, c.numel()
    dm = (state["exp_avg_scale"] * _INV_127_SQ.to(c.device)).unsqueeze(1)
    du = (state["exp_avg_sq_scale"] * _INV_255_SQ.to(c.device)).unsqueeze(1)
    cf = _blocked(c.float())
    qf = _blocked(q.float())
    m = cf * cf.abs() * dm
    u = qf * qf * du
    v = u * u
    return m.reshape(-1)[:n].view(shape), v.reshape(-1)[:n].view(shape)


def to_fp32(state: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
    """exp_avg and exp_avg_sq of a state in any format, as fp32."""
    if format_of(state) == "int8":
        return dequantize(state)
    return state["exp_avg"].float(), state["exp_avg_sq"].float()


def undo_torch_cast(state: dict[str, Any]) -> None:
    """torch.optim.Optimizer.load_state_dict casts every state tensor to the
    parameter's dtype: int8/uint8 codes arrive as (exact) floats. Casts them back."""
    if "exp_avg_scale" in state and state["exp_avg"].is_floating_point():
        state["exp_avg"] = state["exp_avg"].to(torch.int8)
        state["exp_avg_sq"] = state["exp_avg_sq"].to(torch.uint8)


def convert(state: dict[str, Any], state_dtype: str) -> None:
    """Converts a per-parameter Adam state in place to `state_dtype`."""
    undo_torch_cast(state)
    source = format_of(state)
    if source == state_dtype:
        return
    m, v = to_fp32(state)
    for name in SCALE_NAMES:
        state.pop(name, None)
    if state_dtype == "int8":
        state.update(quantize(m, v))
    elif state_dtype == "bf16":
        state["exp_avg"], state["exp_avg_sq"] = m.to(torch.bfloat16), v.to(torch.bfloat16)
    else:
        state["exp_avg"], state["exp_avg_sq"] = m.contiguous(), v.contiguous()
