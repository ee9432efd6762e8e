"""Per-parameter optimizer states (torch's form) into ZeRO's chunk shards.

A torch optimizer keeps, per parameter, {"step": ..., "exp_avg": tensor, ...}, each
state the parameter's shape. ZeRO keeps each state as one flat vector per chunk shard.
load_param_states copies, for every chunk, the slices of each parameter's states that
this rank's shard holds (the step counts too), from entries keyed by ZeRO's parameter
names. Not collective: every rank passes the same entries and takes its own slices.

Two callers: shard() handing over the states of an optimizer that has already stepped
(api.py), and the boosted ZeRO optimizer's load_state_dict (torch's state dict form,
megalith.booster.plugin.zero_wrappers).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from megalith_core.optim import flat_states, lean_states

from .offload import resident_states


def load_param_states(zopt: Any, entries: Mapping[str, Mapping[str, Any]]) -> None:
    """entries: parameter name -> its torch state entry (a parameter left out, or with
    an empty entry, starts fresh: step 0, zero states)."""
    rank = zopt.model.group.rank
    zopt.reducer.wait()
    with resident_states(zopt), torch.no_grad():
        for c in zopt.trainable:
            names = zopt.rule.state_names(zopt.optimizer.param_groups[c.spec.group])
            c.ensure_states(names)
            for st in c.states.values():
                st.zero_()
            lean = c.state_dtype != "fp32"  # staged in fp32, then stored in the format
            values = (
                {n: torch.zeros(c.spec.shard_numel, device=c.master.device) for n in names}
                if lean
                else c.states
            )
            found = [_decoded(entries.get(s.name) or {}) for s in c.spec.slots]
            c.steps = [int(e.get("step", 1 if e else 0)) for e in found]
            for seg in c.spec.segments(rank):
                entry = found[c.spec.slots.index(seg.slot)]
                for n in names:
                    if n not in entry:
                        continue
                    src = entry[n].detach().reshape(-1)
                    if src.numel() != seg.slot.numel:
                        raise ValueError(
                            f"megalith_zero: optimizer state {n!r} of {seg.slot.name!r} has "
                            f"{src.numel()} elements, the parameter {seg.slot.numel} "
                            f"{tuple(seg.slot.shape)}: a state of another model or layout "
                            "(tensor-parallel shards take their slice of the full state)"
                        )
                    src = src[seg.param_start : seg.param_start + seg.length]
                    dst = values[n][seg.shard_start : seg.shard_start + seg.length]
                    dst.copy_(src)
            if lean:
                flat_states.write_fp32(c.states, values)


def _decoded(entry: Mapping[str, Any]) -> Mapping[str, Any]:
    """A per-parameter state in the q8 format (state_dtype="int8": codes and block
    scales) as fp32 exp_avg / exp_avg_sq; other formats as they are."""
    if "exp_avg_scale" not in entry:
        return entry
    out = dict(entry)
    lean_states.undo_torch_cast(out)
    out["exp_avg"], out["exp_avg_sq"] = lean_states.to_fp32(out)
    for name in lean_states.SCALE_NAMES:
        out.pop(name)
    return out


def take_param_states(
    optimizer: torch.optim.Optimizer, named: list[tuple[str, torch.nn.Parameter]]
) -> dict[str, dict[str, Any]]:
    """The states of an optimizer that has stepped, by the parameters' names, removed
    from the optimizer (its state is empty after)."""
    names = {id(p): n for n, p in named}
    out: dict[str, dict[str, Any]] = {}
    for p, entry in list(optimizer.state.items()):
        if entry and id(p) in names:
            out[names[id(p)]] = dict(entry)
    optimizer.state.clear()
    return out
