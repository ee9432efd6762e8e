"""GeneralCheckpointIO: plain and data-parallel (TorchDDPPlugin) models with torch optimizers.

Every rank holds the whole model and every optimizer state, so rank 0 writes them
as they are and every rank reads all of them back. It needs megalith_core's file
format only: saving a DDP model needs no megalith-zero. Subclasses change how a
tensor becomes a full one and back (StateLayout) and which tensors a rank holds.

It also works on its own, as ColossalAI's GeneralCheckpointIO does: on a plain
torch.nn.Module and torch.optim.Optimizer, with no Booster and no process group. A
plain optimizer knows no parameter names, so its states are keyed by the parameter's
index in its param groups ("0::exp_avg"), as torch's own optimizer state_dict is.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from megalith_core.optim.rules import rule_for
from megalith_core.optimizer_files import (
    SEP,
    hyperparameters,
    read_meta,
    state_key,
    write_meta,
)
from megalith_core.safetensors_files import StreamedFiles, TensorReader, write_tensors

from . import async_writes
from .base import CheckpointIO, Writer, is_writer
from .key_check import check_model_files


def named_tensors(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Parameters (tied ones once, under their first name) and persistent buffers."""
    out = {n: p.detach() for n, p in module.named_parameters()}
    persistent = module.state_dict(keep_vars=True).keys()
    out.update({n: b.detach() for n, b in module.named_buffers() if n in persistent})
    return out


def optimizer_kind(optim: torch.optim.Optimizer) -> str:
    """The kind of states an optimizer holds (megalith_core.optim.rules), or for a class
    megalith has no rule for, its name (its states are saved as they are)."""
    try:
        return rule_for(optim).kind
    except ValueError:
        return type(optim).__name__


def _step_kind(state: dict[str, Any]) -> str:
    if "step" not in state:
        return "none"
    return "tensor" if torch.is_tensor(state["step"]) else "number"


def inner_optimizer(optimizer: Any) -> torch.optim.Optimizer:
    """The torch optimizer of a boosted one (a plain one is itself)."""
    return getattr(optimizer, "optim", optimizer)


class WholeStates:
    """How a parameter's optimizer state relates to the full one in the files: here it is
    the full one (a data-parallel rank holds whole parameters)."""

    def parts(self, param: torch.Tensor) -> int:
        """How many of this rank's pieces make the full state."""
        return 1

    def to_full(self, state: torch.Tensor, param: torch.Tensor) -> torch.Tensor:
        return state.detach().float().cpu()

    def to_local(self, full: torch.Tensor, param: torch.Tensor) -> torch.Tensor:
        return full


@dataclass
class OptimizerFiles:
    """What write_optimizer writes: the files' keys with their byte counts (in the order
    `tensors` yields them), optimizer.json's fields, and the full states themselves."""

    plan: list[tuple[str, int]]
    params: dict[str, dict[str, int]]
    tensors: Iterator[tuple[str, torch.Tensor]]
    kind: str
    groups: list[dict[str, Any]]
    loss_scale: dict[str, Any] | None
    grad_scaler: dict[str, Any] | None
    #: how torch keeps a state's "step": "tensor" (Adam), "number", "none" (SGD); None:
    #: not known (ZeRO's files), a tensor beside exp_avg
    step_kind: str | None = None


class GeneralCheckpointIO(CheckpointIO):
    # -- model ----------------------------------------------------------------
    def model_tensors(self, model: Any) -> dict[str, torch.Tensor]:
        """The full tensors rank 0 writes (another rank's may be empty)."""
        return named_tensors(self.whole_module(model))

    def local_names(self, model: Any) -> set[str] | None:
        """The names of the tensors this rank holds; None: all of them."""
        return None

    def write_model(self, model: Any, directory: Path, max_shard_bytes: int) -> None:
        tensors = {k: v.cpu() for k, v in self.model_tensors(model).items()}
        write_tensors(directory, "model", tensors, max_shard_bytes, write=is_writer())

    def capture_model(self, model: Any) -> Writer | None:
        """The writer's host copies in the pinned region "model", reused from save to save
        (async_writes.snapshots); the other ranks copy nothing."""
        tensors = self.model_tensors(model)  # collective for the subclasses that gather
        writer = is_writer()
        sizes = [(t.numel(), t.dtype) for t in tensors.values()]
        copies, region = async_writes.snapshots("model", tensors.items(), sizes, writer)
        host = dict(copies)

        def write(directory: Path, cap: int) -> None:
            write_tensors(directory, "model", host, cap, writer)

        write.release = region.release if region is not None else None  # type: ignore[attr-defined]
        return write

    def read_model(self, model: Any, directory: Path, strict: bool) -> None:
        whole = self.whole_module(model)
        want = named_tensors(whole)
        check_model_files(
            directory,
            {k: tuple(t.shape) for k, t in want.items()},
            strict=strict,
            known=whole.state_dict(keep_vars=True).keys(),
            what=type(whole).__name__,
        )
        mine = self.local_names(model)
        if mine is not None:
            want = {k: t for k, t in want.items() if k in mine}
        with TensorReader(directory, "model") as reader, torch.no_grad():
            for k, t in want.items():
                if reader.has(k):
                    t.copy_(reader.get(k))

    # -- optimizer ------------------------------------------------------------
    def model_of(self, optimizer: Any) -> Any:
        """The boosted model an optimizer steps (None for a plain torch optimizer)."""
        return getattr(optimizer, "model", None)

    def state_layout(self, model: Any) -> WholeStates:
        return WholeStates()

    def param_names(self, model: Any, optim: torch.optim.Optimizer) -> dict[int, str]:
        """Parameter names (a tied one under its first name) in the model as given to boost();
        without a model, each parameter's index in the optimizer's param groups."""
        if model is None:
            params = [p for g in optim.param_groups for p in g["params"]]
            return {id(p): str(i) for i, p in enumerate(params)}
        return {id(p): n for n, p in self.whole_module(model).named_parameters()}

    def optimizer_files(self, optimizer: Any) -> OptimizerFiles:
        optim, model = inner_optimizer(optimizer), self.model_of(optimizer)
        layout = self.state_layout(model)
        names = self.param_names(model, optim)
        params, plan, work = {}, [], []
        step_kind: str | None = None
        for gi, g in enumerate(optim.param_groups):
            for p in g["params"]:
                state = optim.state.get(p, {})
                step = int(state["step"]) if "step" in state else (1 if state else 0)
                params[names[id(p)]] = {"group": gi, "step": step}
                if state and step_kind is None:  # restored as it was (optimizer.json)
                    step_kind = _step_kind(state)
                for k, v in state.items():
                    if k != "step" and torch.is_tensor(v):
                        key = state_key(names[id(p)], k)
                        work.append((key, v, p))
                        plan.append((key, v.numel() * 4 * layout.parts(p)))
        scaler = getattr(optimizer, "scaler", None)  # torch's GradScaler (TorchDDPPlugin)
        loss_scaler = getattr(optimizer, "loss_scaler", None)  # megalith's (HybridParallelPlugin)
        if loss_scaler is not None:
            loss_scale = loss_scaler.state_dict()
        elif scaler:  # in the form a ZeRO plugin reads
            loss_scale = {"scale": float(scaler.get_scale()), "clean_steps": 0}
        else:
            loss_scale = None
        return OptimizerFiles(
            plan=plan,
            params=params,
            tensors=((key, layout.to_full(v, p)) for key, v, p in work),
            kind=optimizer_kind(optim),
            groups=optim.param_groups,
            loss_scale=loss_scale,
            grad_scaler=dict(scaler.state_dict()) if scaler else None,
            step_kind=step_kind,
        )

    def write_optimizer(self, optimizer: Any, directory: Path, max_shard_bytes: int) -> None:
        write_optimizer_files(self.optimizer_files(optimizer), directory, max_shard_bytes)

    def capture_optimizer(self, optimizer: Any) -> Writer | None:
        files = self.optimizer_files(optimizer)
        # The full states are fp32 (plan: their bytes); files.tensors is collective.
        sizes = [(nbytes // 4, torch.float32) for _, nbytes in files.plan]
        tensors, region = async_writes.snapshots("optimizer", files.tensors, sizes, is_writer())
        files = OptimizerFiles(
            plan=files.plan,
            params=copy.deepcopy(files.params),
            tensors=iter(tensors),
            kind=files.kind,
            groups=hyperparameters(files.groups),
            loss_scale=copy.deepcopy(files.loss_scale),
            grad_scaler=copy.deepcopy(files.grad_scaler),
            step_kind=files.step_kind,
        )

        def write(directory: Path, cap: int) -> None:
            write_optimizer_files(files, directory, cap)

        write.release = region.release if region is not None else None  # type: ignore[attr-defined]
        return write

    def read_optimizer(self, optimizer: Any, directory: Path) -> None:
        meta = read_meta(directory)
        optim, model = inner_optimizer(optimizer), self.model_of(optimizer)
        if meta["kind"] != optimizer_kind(optim):
            raise ValueError(
                f"{directory} holds {meta['kind']} states but the optimizer is "
                f"{type(optim).__name__}; build the same kind of optimizer as the one that saved it"
            )
        layout = self.state_layout(model)
        names = self.param_names(model, optim)
        state: dict[int, dict[str, Any]] = {}
        groups = []
        index = 0
        with TensorReader(directory, "optimizer") as reader:
            keys = list(reader.keys())
            for gi, g in enumerate(optim.param_groups):
                ids = []
                for p in g["params"]:
                    name = names[id(p)]
                    saved = meta["params"].get(name, {"step": 0})
                    entry = {
                        k.split(SEP, 1)[1]: layout.to_local(reader.get(k), p).to(p.device)
                        for k in keys
                        if k.startswith(name + SEP)
                    }
                    if entry or saved["step"]:
                        kind = meta.get("step_kind") or ("tensor" if "exp_avg" in entry else "none")
                        if kind == "tensor":
                            entry["step"] = torch.tensor(float(saved["step"]))
                        elif kind == "number":
                            entry["step"] = saved["step"]
                        state[index] = entry
                    ids.append(index)
                    index += 1
                hyper = dict(meta["param_groups"][gi]) if gi < len(meta["param_groups"]) else {}
                rest = {k: v for k, v in g.items() if k != "params"}
                groups.append({**rest, **hyper, "params": ids})
        for g in groups:
            if isinstance(g.get("betas"), list):
                g["betas"] = tuple(g["betas"])
        optim.load_state_dict({"state": state, "param_groups": groups})
        if getattr(optimizer, "fp32_states", False):  # torch's load cast them to bf16
            restore_fp32_states(optim, state)
        scaler = getattr(optimizer, "scaler", None)
        if scaler is not None and meta.get("grad_scaler"):
            scaler.load_state_dict(meta["grad_scaler"])
        loss_scaler = getattr(optimizer, "loss_scaler", None)
        if loss_scaler is not None and meta.get("loss_scale"):
            loss_scaler.load_state_dict(meta["loss_scale"])


def restore_fp32_states(optim: torch.optim.Optimizer, state: dict[int, dict[str, Any]]) -> None:
    """After optim.load_state_dict(state): each state the loaded values in fp32.

    torch's Optimizer.load_state_dict casts every state to its parameter's dtype; an
    optimizer that steps half-precision parameters through fp32 masters (HybridOptimizer
    at zero_stage 0) keeps its states fp32, so they are put back from `state` (torch's
    numbering: parameters in param-group order), copied, uncast."""
    params = [p for g in optim.param_groups for p in g["params"]]
    for i, entry in state.items():
        held = optim.state.get(params[i])
        if not held:
            continue
        for k, v in entry.items():
            if k != "step" and k in held and torch.is_tensor(v) and v.is_floating_point():
                held[k] = v.detach().to(device=held[k].device, dtype=torch.float32, copy=True)


def write_optimizer_files(files: OptimizerFiles, directory: Path, max_shard_bytes: int) -> None:
    """The states as StreamedFiles, then optimizer.json (rank 0 writes; the others take
    part in the gathers `files.tensors` makes)."""
    rank0 = is_writer()
    out = StreamedFiles(directory, "optimizer", files.plan, max_shard_bytes, write=rank0)
    for key, t in files.tensors:
        out.add(key, t)
    out.finish()
    if rank0:
        write_meta(
            directory,
            files.kind,
            files.groups,
            files.params,
            files.loss_scale,
            grad_scaler=files.grad_scaler,
            step_kind=files.step_kind,
        )
