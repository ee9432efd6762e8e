"""The boosted optimizers of LowLevelZeroPlugin and GeminiPlugin, under ColossalAI's names.

ColossalAI's boosted ZeRO optimizer keeps the user's torch optimizer as `.optim`, with
param_groups and a state holding this rank's shards; scripts and tests read it there.
megalith's ZeroOptimizer (`.zero_optimizer`) steps the chunks with the engine's kernel
and never fills the torch optimizer's state, so `.optim` (and `.state`) first point
each parameter's state entry at this rank's slice of the chunk's states: views, not
copies, so what torch's state_dict() shows is what the next step updates.

LowLevelZeroPlugin lays every parameter out as a chunk of its own (megalith_zero's
shard_each_param), so a rank's shard of a parameter is its equal slice, padded to a
whole number of aligned shards: that shard's fp32 master is what ColossalAI's
working_to_master_param maps the parameter to, and the state tensors have its length.
The gradient reductions and the parameter gathers still go a bucket of consecutive
parameters at a time, one collective per reduce_bucket_size_in_m MiB (megalith_zero's
buckets.py); the same numbers as one per parameter (bit for bit at world 2).
"""

from __future__ import annotations

from typing import Any

import torch

from .zero_wrappers import ZeroModelWrapper, ZeroOptimizerWrapper


def refresh_state_views(zopt: Any) -> None:
    """The user's torch optimizer's state: per parameter, "step" and each optimizer
    state of this rank's shard (the whole shard of a one-parameter chunk, padding
    included, else the parameter's segment). Chunks whose states are on NVMe (not
    resident) and parameters this rank holds no part of get no entry."""
    state = zopt.optimizer.state
    state.clear()
    for c in zopt.trainable:
        if not c.states or c.tier == "nvme":
            continue
        for i, lo, hi in state_pieces(c):
            entry: dict[str, Any] = {"step": torch.tensor(float(c.steps[i]))}
            entry.update(_state_piece(c.states, lo, hi))
            state[c.params[i]] = entry


def state_pieces(chunk: Any) -> list[tuple[int, int, int]]:
    """(parameter index in the chunk, start, end) of this rank's shard range of each
    parameter it holds part of (a one-parameter chunk: the whole shard, padding too)."""
    spec = chunk.spec
    if len(spec.slots) == 1:  # every rank holds a slice (maybe padding only)
        return [(0, 0, spec.shard_numel)]
    return [
        (spec.slots.index(s.slot), s.shard_start, s.shard_start + s.length)
        for s in spec.segments(chunk.rank)
    ]


def _state_piece(states: dict[str, torch.Tensor], lo: int, hi: int) -> dict[str, torch.Tensor]:
    """Shard range [lo, hi) of a chunk's states: views of the stored vectors (int8
    states: the codes and their block scales, as CPUAdam(state_dtype="int8") keeps them)
    when the range starts on a 256-element block (and ends on one, or at the shard's
    end); else an int8 range gets decoded fp32 copies, since it shares its end blocks'
    scales with a neighbouring parameter."""
    from megalith_core.optim import flat_states

    numel = states["exp_avg"].numel() if "exp_avg" in states else 0
    sl = slice(lo, hi)
    if flat_states.format_of(states) != "int8":
        return {n: t[lo:hi] for n, t in states.items()}
    if flat_states.block_aligned(sl, numel):
        return flat_states.piece(states, sl)
    block = flat_states.block_range(sl, numel)
    values = flat_states.to_fp32(flat_states.piece(states, block))
    return {n: t[lo - block.start : hi - block.start].clone() for n, t in values.items()}


class _TorchFacingOptimizer(ZeroOptimizerWrapper):
    """Built only through the Booster (ColossalAI's class names for isinstance checks)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise TypeError(
            f"{type(self).__name__}(...): megalith builds it through the Booster: "
            f"Booster(plugin={self._plugin}(...)).boost(model, optimizer) returns one"
        )

    _plugin = "LowLevelZeroPlugin"

    @classmethod
    def boosted(cls, zopt: Any, model: ZeroModelWrapper, max_norm: float, only_rank_0: bool):
        self = cls.__new__(cls)
        ZeroOptimizerWrapper.__init__(self, zopt, model, max_norm, only_rank_0)
        return self


class GeminiOptimizer(_TorchFacingOptimizer):
    """GeminiPlugin's boosted optimizer (ZeRO stage 3 over chunks)."""

    _plugin = "GeminiPlugin"


class LowLevelZeroOptimizer(_TorchFacingOptimizer):
    """LowLevelZeroPlugin's boosted optimizer (ZeRO stage 1 or 2), with the internals
    ColossalAI's users read: each trainable parameter's fp32 master (this rank's equal
    slice of it, padded), the padding, and the full reduced gradient."""

    def _single(self) -> list[tuple[torch.nn.Parameter, Any]]:
        """(working parameter, its chunk) of every trainable one-parameter chunk whose
        master is resident (NVMe masters live in their swap file)."""
        return [
            (c.params[0], c)
            for c in self.zero_optimizer.trainable
            if len(c.spec.slots) == 1 and not c.masters_on_nvme
        ]

    def _chunk_of(self, param: torch.Tensor) -> Any:
        for c in self.zero_optimizer.chunks:
            for p in c.params:
                if p is param:
                    return c
        raise KeyError(
            f"a parameter of shape {tuple(param.shape)} that this optimizer does not hold: "
            "pass one of the boosted model's parameters"
        )

    @property
    def working_to_master_param(self) -> dict[int, torch.Tensor]:
        """id(working parameter) -> its fp32 master on this rank (the chunk's own tensor:
        writing it changes what the next step starts from)."""
        return {id(p): c.master for p, c in self._single()}

    @property
    def master_to_working_param(self) -> dict[int, torch.nn.Parameter]:
        return {id(c.master): p for p, c in self._single()}

    def get_working_to_master_map(self) -> dict[int, torch.Tensor]:
        return self.working_to_master_param

    def get_master_to_working_map(self) -> dict[int, torch.nn.Parameter]:
        return self.master_to_working_param

    def get_param_padding_size(self, param: torch.Tensor) -> int:
        """Elements after the parameter in its chunk: pad(param.view(-1), (0, padding))
        splits into world equal shards, this rank's being its master."""
        c = self._chunk_of(param)
        if len(c.spec.slots) != 1:
            raise ValueError(
                "get_param_padding_size: the parameter shares its chunk with others "
                "(megalith_zero's packed layout); LowLevelZeroPlugin lays out one per chunk"
            )
        return c.spec.numel - param.numel()

    def get_param_padding_map(self) -> dict[int, int]:
        return {id(p): c.spec.numel - p.numel() for p, c in self._single()}

    get_padding_map = get_param_padding_map

    def update_master_params(self, model: Any) -> None:
        """Each master from its working parameter's current values (after the user
        wrote the working parameters)."""
        module = model.unwrap() if hasattr(model, "unwrap") else model
        mine = {id(p): c for p, c in self._single()}
        with torch.no_grad():
            for p in module.parameters():
                c = mine.get(id(p))
                if c is not None:
                    full = torch.nn.functional.pad(
                        p.detach().reshape(-1), (0, c.spec.numel - p.numel())
                    )
                    c.master.copy_(full.chunk(c.spec.world)[c.rank])

    def get_param_grad(self, working_param: torch.Tensor) -> torch.Tensor | None:
        """The gradient the next step uses (averaged over the data-parallel ranks, loss
        scale divided out), whole, in the reduce dtype; None before backward reduced it.
        Collective over ZeRO's group: every rank calls it."""
        import megalith_comm as comm

        zopt = self.zero_optimizer
        c = self._chunk_of(working_param)
        zopt.reducer.wait()
        if not c.trainable or not c.grad_valid:
            return None
        full = torch.empty(c.spec.numel, dtype=c.shard_grad.dtype, device=c.shard_grad.device)
        comm.all_gather(full, c.shard_grad.contiguous(), group=zopt.group)
        slot = c.spec.slots[[p is working_param for p in c.params].index(True)]
        grad = full[slot.offset : slot.offset + slot.numel].view(slot.shape)
        return grad / self.loss_scale if self.loss_scale != 1.0 else grad
