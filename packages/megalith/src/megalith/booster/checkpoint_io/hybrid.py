"""HybridParallelCheckpointIO: HybridParallelPlugin's models at zero_stage 0, and every
pipelined one (pp_size > 1, with a plain or a ZeRO optimizer).

The files are GeneralCheckpointIO's. A tensor-parallel model's shards (parameters
and optimizer states) are gathered over the tp group to full tensors, one at a time
as the writer takes them, and on loading each rank takes its shard (ShardSpec.take),
so tp 2 files load at tp 1 and back. A pipelined model's stages are collected on
rank 0 (pipeline_stages.py) and named by the whole model; each rank reads back its
own stages' tensors. (At zero_stage 1 or 2 without a pipeline the plugin's I/O is
ZeroCheckpointIO over tp_layout.py.)
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import torch

from megalith_core.optimizer_files import SEP
from megalith_core.safetensors_files import TensorReader

from ..plugin.base import require
from ..plugin.hybrid_pipeline import PipelineModel
from ..plugin.zero import ZeroOptimizerWrapper
from . import pipeline_stages
from .general import GeneralCheckpointIO, OptimizerFiles, WholeStates, named_tensors
from .key_check import check_model_files
from .tp_layout import tp_layout


def tp_group(module: torch.nn.Module) -> Any:
    """The tensor-parallel group a module was sharded over, or None."""
    info = getattr(module, "tp_info", None)
    return info.group if info is not None else None


def full_tensors(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """A tensor-parallel module's full tensors, tied ones once (under their first name).
    Meta tensors (another pipeline stage's, not held here) are left out: every rank of a
    tp group holds the same stages, so the gathers still match."""
    from megalith.tensor_parallel.state import gather_full

    group = module.tp_info.group
    first: dict[int, str] = {}
    held: dict[str, torch.Tensor] = {}
    for name, t in module.state_dict(keep_vars=True).items():
        if id(t) not in first and not t.is_meta:
            first[id(t)] = name
            held[name] = t
    return {name: gather_full(t, group) for name, t in held.items()}


class TensorParallelStates(WholeStates):
    """A tp-sharded parameter's optimizer state is its shard of the full one."""

    def __init__(self, tp: Any) -> None:
        self.tp = tp

    def parts(self, param: torch.Tensor) -> int:
        return self.tp.size if hasattr(param, "tp_spec") else 1

    def to_full(self, state: torch.Tensor, param: torch.Tensor) -> torch.Tensor:
        from megalith.tensor_parallel.state import gather_full

        state = state.detach().float()
        spec = getattr(param, "tp_spec", None)
        return (gather_full(state, self.tp, spec) if spec is not None else state).cpu()

    def to_local(self, full: torch.Tensor, param: torch.Tensor) -> torch.Tensor:
        spec = getattr(param, "tp_spec", None)
        return spec.take(full, self.tp.rank, self.tp.size) if spec is not None else full


class HybridParallelCheckpointIO(GeneralCheckpointIO):
    def whole_module(self, model: Any) -> torch.nn.Module:
        return model.whole if isinstance(model, PipelineModel) else model.unwrap()

    # -- model ----------------------------------------------------------------
    def model_tensors(self, model: Any) -> dict[str, torch.Tensor]:
        whole = self.whole_module(model)
        state = full_tensors(whole) if tp_group(whole) is not None else named_tensors(whole)
        if isinstance(model, PipelineModel):
            return pipeline_stages.full_state(model, state)
        return state

    def local_names(self, model: Any) -> set[str] | None:
        return pipeline_stages.local_names(model) if isinstance(model, PipelineModel) else None

    def read_model(self, model: Any, directory: Path, strict: bool) -> None:
        whole = self.whole_module(model)
        if tp_group(whole) is None:
            return super().read_model(model, directory, strict)
        from megalith.tensor_parallel.state import load_full_state_dict

        wanted = self.local_names(model)
        names: dict[int, list[str]] = {}
        for name, t in whole.state_dict(keep_vars=True).items():
            if wanted is None or name in wanted:
                names.setdefault(id(t), []).append(name)
        every = whole.state_dict(keep_vars=True)
        groups: dict[int, list[str]] = {}
        for name, t in every.items():
            groups.setdefault(id(t), []).append(name)
        check_model_files(  # the full shapes are the files' business: not checked here
            directory,
            {g[0]: None for g in groups.values()},
            strict=strict,
            aliases={g[0]: g for g in groups.values()},
            what=type(whole).__name__,
        )
        with TensorReader(directory, "model") as reader:
            state = {}
            for aliases in names.values():  # a tied tensor is in the files under one of its names
                stored = next((n for n in aliases if reader.has(n)), None)
                if stored is not None:
                    state.update({n: reader.get(stored) for n in aliases})
        load_full_state_dict(whole, state, strict=strict and wanted is None)
        return None

    # -- optimizer ------------------------------------------------------------
    def model_of(self, optimizer: Any) -> Any:
        return getattr(optimizer, "pipeline_model", None) or optimizer.model

    def state_layout(self, model: Any) -> WholeStates:
        tp = tp_group(self.whole_module(model))
        return TensorParallelStates(tp) if tp is not None else WholeStates()

    def stage_layout(self, model: PipelineModel, zopt: Any) -> Any:
        """ZeRO's file layout for a pipeline stage: tp shards, named by the whole model."""
        names = pipeline_stages.stage_file_names(model)
        return tp_layout(zopt.model, tp=model.mesh.group("tp"), file_names=names)

    def zero_stage_files(self, optimizer: Any, model: PipelineModel) -> OptimizerFiles:
        """A ZeRO optimizer's states of this rank's stages (gathered over dp and tp)."""
        full_optimizer = require(
            "megalith_zero", "megalith-zero", "ZeRO checkpoints"
        ).full_optimizer
        zopt = optimizer.zero_optimizer
        zopt.reducer.wait()
        layout = self.stage_layout(model, zopt)
        plan, params = full_optimizer.full_plan(zopt, layout)
        return OptimizerFiles(
            plan=plan,
            params=params,
            tensors=full_optimizer.full_states(zopt, layout),
            kind=zopt.rule.kind,
            groups=zopt.optimizer.param_groups,
            loss_scale=zopt.scaler.state_dict() if zopt.scaler is not None else None,
            grad_scaler=None,
        )

    def optimizer_files(self, optimizer: Any) -> OptimizerFiles:
        """A pipelined model's stages' states collected on rank 0 (pipeline_stages.py)."""
        model = self.model_of(optimizer)
        if isinstance(optimizer, ZeroOptimizerWrapper):
            files = self.zero_stage_files(optimizer, model)
        else:
            files = super().optimizer_files(optimizer)
        if not isinstance(model, PipelineModel):
            return files
        plan, params, tensors = pipeline_stages.full_optimizer_states(
            model, files.plan, files.params, files.tensors, SEP
        )
        # in the plan's order: an async save pairs each tensor with its plan entry
        ordered = ((key, tensors[key]) for key, _ in plan)
        return dataclasses.replace(files, plan=plan, params=params, tensors=ordered)

    def read_optimizer(self, optimizer: Any, directory: Path) -> None:
        """A pipelined model's ranks read their stages' parameters only."""
        if isinstance(optimizer, ZeroOptimizerWrapper):
            zero = require("megalith_zero", "megalith-zero", "ZeRO checkpoints")
            zopt = optimizer.zero_optimizer
            layout = self.stage_layout(self.model_of(optimizer), zopt)
            zero.load_full_optimizer(zopt.model, zopt, directory, layout=layout)
            return
        super().read_optimizer(optimizer, directory)
