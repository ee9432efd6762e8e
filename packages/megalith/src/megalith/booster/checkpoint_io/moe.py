"""MoECheckpointIO: MoeHybridParallelPlugin's models with experts split over ep ranks.

The files hold every expert, as transformers writes them (gate_up_proj [E, 2I, H]): each
rank's experts are gathered over its ep group as the writer takes them, and on loading
each rank takes its own (ShardSpec.take along the experts), so a checkpoint moves between
ep sizes and to and from transformers. Optimizer states of expert weights likewise.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from megalith_core.safetensors_files import TensorReader

from .general import WholeStates, named_tensors
from .hybrid import HybridParallelCheckpointIO
from .key_check import check_model_files


def _is_expert(t: torch.Tensor) -> bool:
    return hasattr(t, "ep_spec")


def _full(t: torch.Tensor) -> torch.Tensor:
    from megalith.tensor_parallel.state import gather_full

    return gather_full(t, t.ep_group, t.ep_spec)


class ExpertStates(WholeStates):
    """An expert weight's optimizer state is its experts' part of the full one."""

    def parts(self, param: torch.Tensor) -> int:
        return param.ep_group.size if _is_expert(param) else 1

    def to_full(self, state: torch.Tensor, param: torch.Tensor) -> torch.Tensor:
        from megalith.tensor_parallel.state import gather_full

        state = state.detach().float()
        if _is_expert(param):
            state = gather_full(state, param.ep_group, param.ep_spec)
        return state.cpu()

    def to_local(self, full: torch.Tensor, param: torch.Tensor) -> torch.Tensor:
        if not _is_expert(param):
            return full
        return param.ep_spec.take(full, param.ep_group.rank, param.ep_group.size)


class MoECheckpointIO(HybridParallelCheckpointIO):
    def model_tensors(self, model: Any) -> dict[str, torch.Tensor]:
        whole = self.whole_module(model)
        out = named_tensors(whole)
        for name, p in whole.named_parameters():  # in the same order on every rank
            if _is_expert(p):
                out[name] = _full(p)
        return out

    def read_model(self, model: Any, directory: Path, strict: bool) -> None:
        whole = self.whole_module(model)
        params = dict(whole.named_parameters())
        want = named_tensors(whole)
        shapes = {
            k: tuple(params[k].ep_spec.full_shape(t.shape))
            if k in params and _is_expert(params[k])
            else tuple(t.shape)
            for k, t in want.items()
        }
        check_model_files(
            directory, shapes, strict=strict, known=whole.state_dict(keep_vars=True).keys(),
            what=type(whole).__name__,
        )  # fmt: skip
        with TensorReader(directory, "model") as reader, torch.no_grad():
            for k, t in want.items():
                if not reader.has(k):
                    continue
                src = reader.get(k)
                p = params.get(k)
                if p is not None and _is_expert(p):
                    src = p.ep_spec.take(src, p.ep_group.rank, p.ep_group.size)
                t.copy_(src)

    def state_layout(self, model: Any) -> WholeStates:
        return ExpertStates()


__all__ = ["ExpertStates", "MoECheckpointIO"]
