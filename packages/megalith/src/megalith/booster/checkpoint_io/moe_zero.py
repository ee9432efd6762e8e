"""MoEZeroCheckpointIO: MoeHybridParallelPlugin at ep_size > 1 with zero_stage 1
(plugin/moe_zero.py: ZeRO over the dense weights, a plain optimizer over the experts).

The files are MoECheckpointIO's (every expert, as transformers writes them; optimizer
states keyed by parameter name, layout-free): the dense weights and their states
gathered from ZeRO's shards over dp (fp32 masters), the experts' over ep. On loading,
megalith_zero reads the dense parameters' slices its shards hold and each rank takes its
own experts, so the files move to and from zero_stage 0, other ep sizes and transformers.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import torch

from megalith_core.safetensors_files import TensorReader

from ..plugin.base import require
from .general import GeneralCheckpointIO, OptimizerFiles, named_tensors
from .moe import MoECheckpointIO


def _zero() -> Any:
    return require("megalith_zero", "megalith-zero", "ZeRO checkpoints")


class MoEZeroCheckpointIO(MoECheckpointIO):
    def model_tensors(self, model: Any) -> dict[str, torch.Tensor]:
        from megalith.tensor_parallel.state import gather_full

        zmodel, whole = model.module, model.unwrap()
        out = named_tensors(whole)
        # the dense weights' fp32 masters, gathered over dp one chunk at a time
        out.update(_zero().full_state.iter_full_params(zmodel.chunks, zmodel.group))
        for name, p in whole.named_parameters():  # in the same order on every rank
            if hasattr(p, "ep_spec"):  # gathered over ep (fp32 masters under bf16)
                out[name] = gather_full(model.expert_value(p), p.ep_group, p.ep_spec)
        return out

    def read_model(self, model: Any, directory: Path, strict: bool) -> None:
        super().read_model(model, directory, strict)  # keys checked; experts and buffers
        zmodel = model.module  # the dense weights into ZeRO's masters, then its working copy
        _zero().load_full(zmodel, zmodel.optimizer, directory)
        with TensorReader(directory, "model") as reader:  # the experts' fp32 masters
            for name, p in model.unwrap().named_parameters():
                if hasattr(p, "ep_spec") and reader.has(name):
                    part = p.ep_spec.take(reader.get(name), p.ep_group.rank, p.ep_group.size)
                    model.set_expert(p, part)

    def optimizer_files(self, optimizer: Any) -> OptimizerFiles:
        full_optimizer = _zero().full_optimizer
        zopt = optimizer.zero_optimizer
        zopt.reducer.wait()
        plan, params = full_optimizer.full_plan(zopt)
        experts = GeneralCheckpointIO.optimizer_files(self, optimizer.experts)
        return OptimizerFiles(
            plan=plan + experts.plan,
            params={**params, **experts.params},
            tensors=itertools.chain(full_optimizer.full_states(zopt), experts.tensors),
            kind=zopt.rule.kind,
            groups=zopt.optimizer.param_groups,
            loss_scale=None,
            grad_scaler=None,
            step_kind=None,  # as ZeRO's files: a step beside exp_avg, none for SGD
        )

    def read_optimizer(self, optimizer: Any, directory: Path) -> None:
        zopt = optimizer.zero_optimizer
        _zero().load_full_optimizer(zopt.model, zopt, directory)
        GeneralCheckpointIO.read_optimizer(self, optimizer.experts, directory)


__all__ = ["MoEZeroCheckpointIO"]
