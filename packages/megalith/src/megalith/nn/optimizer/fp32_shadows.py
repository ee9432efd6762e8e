"""Stepping an fp32-only optimizer over half-precision or DTensor parameters.

megalith's engine optimizers (HybridAdam, CPUAdam, FusedAdam, FusedSGD) update plain,
contiguous fp32 tensors. ColossalAI's scripts hand them two other kinds:

- half-precision parameters (a model built with torch_dtype=torch.bfloat16): ColossalAI's
  HybridAdam loads each bf16 value, updates it in fp32 and stores it back in bf16, its
  states kept in the parameter's dtype (its CUDA kernel; MATH_T = float);
- FSDP2's DTensor parameters (TorchFSDPPlugin), whose data is this rank's shard.

`Fp32Shadows.stepping(optimizer)` puts, for the length of one step, a plain fp32 tensor
("shadow") in each such parameter's place in the param groups, with an fp32 gradient
and the parameter's state re-keyed to it (each state tensor as fp32, local); after the
step the shadow's values go back into the parameter (rounded to its dtype, into its
local shard) and the states back under the parameter. With keep_masters=False (the
optimizer's own bf16 rule) a shadow lives for one step and states return in the
parameter's dtype, as ColossalAI's HybridAdam keeps them; with keep_masters=True the
shadows are persistent fp32 master weights and states stay fp32, as ColossalAI's
mixed-precision optimizer wrapper (HybridParallelAMPOptimizer) keeps them. A master is
taken again from its parameter when something else wrote the parameter since the last
step (a checkpoint load, the user): the parameter's version counter tells.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch

HALF = (torch.bfloat16, torch.float16)


def _dtensor_type() -> type | None:
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # torch built without distributed
        return None
    return DTensor


def _is_dtensor(t: Any) -> bool:
    cls = _dtensor_type()
    return cls is not None and isinstance(t, cls)


def needs_shadow(p: torch.Tensor, group: dict[str, Any] | None = None) -> bool:
    """A parameter an fp32 engine kernel cannot step in place. A plain bf16 parameter
    of a group with master_dtype="bf16" is stepped in place (its Kahan compensation)."""
    if group is not None and group.get("master_dtype") == "bf16" and not _is_dtensor(p):
        return False
    return p.dtype in HALF or _is_dtensor(p)


def _local(t: torch.Tensor) -> torch.Tensor:
    """The tensor's own storage, detached (a DTensor's local shard); a plain tensor's
    detach() shares its version counter, which `.data` does not."""
    t = t.detach()
    return t.to_local() if _is_dtensor(t) else t


@dataclass
class _Swap:
    param: torch.Tensor
    shadow: torch.Tensor
    local: torch.Tensor  # the parameter's own storage (its shard under FSDP)
    writes_back: bool  # False: the shadow is the local storage itself
    lean: bool  # the group keeps lean states (state_dtype bf16 / int8): left in their format


class Fp32Shadows:
    def __init__(self, keep_masters: bool = False) -> None:
        self.keep_masters = keep_masters
        self._masters: dict[int, tuple[torch.Tensor, int]] = {}

    def master(self, p: torch.Tensor) -> torch.Tensor | None:
        """keep_masters: p's fp32 master while nothing else has written p since (None
        otherwise: the next step takes it again from p)."""
        held = self._masters.get(id(p))
        if held is None or held[1] != _local(p)._version:
            return None
        return held[0]

    def set_master(self, p: torch.Tensor, value: torch.Tensor) -> None:
        """keep_masters: `value` (fp32, p's local shape) becomes p's master, p its rounded
        copy (a checkpoint's fp32 weights loaded into a half-precision parameter)."""
        local = _local(p)
        with torch.no_grad():
            local.copy_(value)
        self._masters[id(p)] = (value.detach().float().contiguous().clone(), local._version)

    def _shadow(self, p: torch.Tensor, local: torch.Tensor) -> tuple[torch.Tensor, bool]:
        if local.dtype == torch.float32 and local.is_contiguous():
            return local.detach(), False  # updated in place: nothing to write back
        if not self.keep_masters:
            return local.detach().float().contiguous(), True
        held = self._masters.get(id(p))
        if held is None or held[1] != local._version:
            held = (local.detach().float().contiguous(), local._version)
            self._masters[id(p)] = held
        return held[0], True

    @contextlib.contextmanager
    def stepping(self, optimizer: torch.optim.Optimizer) -> Iterator[None]:
        swaps: list[_Swap] = []
        kept_lists = []
        for group in optimizer.param_groups:
            kept_lists.append(group["params"])
            lean = group.get("state_dtype", "fp32") != "fp32"
            params = []
            for p in group["params"]:
                if p.grad is None or not needs_shadow(p, group):
                    params.append(p)
                    continue
                local = _local(p)
                shadow, writes_back = self._shadow(p, local)
                shadow.grad = _local(p.grad).to(torch.float32)
                state = optimizer.state.pop(p, None)
                if state:
                    optimizer.state[shadow] = {
                        k: _to_shadow(v, lean) if _is_state_tensor(v, p) else v
                        for k, v in state.items()
                    }
                swaps.append(_Swap(p, shadow, local, writes_back, lean))
                params.append(shadow)
            group["params"] = params
        try:
            yield
        finally:
            for group, kept in zip(optimizer.param_groups, kept_lists):
                group["params"] = kept
            with torch.no_grad():
                for s in swaps:
                    self._put_back(optimizer, s)

    def _put_back(self, optimizer: torch.optim.Optimizer, s: _Swap) -> None:
        p = s.param
        if s.writes_back:
            s.local.copy_(s.shadow)
            if self.keep_masters:
                self._masters[id(p)] = (s.shadow, s.local._version)
        s.shadow.grad = None
        state = optimizer.state.pop(s.shadow, None)
        if not state:
            return
        dtype = torch.float32 if self.keep_masters else p.dtype
        optimizer.state[p] = {
            k: _like_param(v if s.lean else v.to(dtype), p) if _is_state_tensor(v, s.shadow) else v
            for k, v in state.items()
        }


def _to_shadow(v: torch.Tensor, lean: bool) -> torch.Tensor:
    return _local(v) if lean else _local(v).float()


def _is_state_tensor(v: Any, like: torch.Tensor) -> bool:
    """A per-element state (exp_avg, ...), not the scalar step or a per-block scale."""
    return torch.is_tensor(v) and v.is_floating_point() and _local(v).shape == _local(like).shape


def _like_param(t: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """A local state tensor placed as the parameter is (a DTensor of its mesh and
    placements; no communication)."""
    if not _is_dtensor(p):
        return t
    cls = _dtensor_type()
    return cls.from_local(
        t, p.device_mesh, p.placements, run_check=False, shape=p.shape, stride=p.stride()
    )
