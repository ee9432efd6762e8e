"""GeneralCheckpointIO: plain and data-parallel (TorchDDPPlugin) models with torch optimizers.

Every rank holds the whole model and every optimizer state, so rank 0 writes them
as they are and every rank reads all of them back. It needs megalith_core's file
format only: saving a DDP model needs no megalith-zero. Subclasses change how a
tensor becomes a full one and back (StateLayout) and which tensors a rank holds.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from megalith_core.optim.rules import rule_for
from megalith_core.optimizer_files import SEP, read_meta, state_key, write_meta
from megalith_core.safetensors_files import StreamedFiles, TensorReader, write_tensors

from .base import CheckpointIO, is_writer


def named_tensors(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Parameters (tied ones once, under their first name) and persistent buffers."""
    out = {n: p.detach() for n, p in module.named_parameters()}
    persistent = module.state_dict(keep_vars=True).keys()
    out.update({n: b.detach() for n, b in module.named_buffers() if n in persistent})
    return out


def optimizer_kind(optim: torch.optim.Optimizer) -> str:
    """The kind of states an optimizer holds (megalith_core.optim.rules)."""
    try:
        return rule_for(optim).kind
    except ValueError as exc:
        raise ValueError(f"saving {type(optim).__name__}: {exc}") from None


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

    def read_model(self, model: Any, directory: Path, strict: bool) -> None:
        want = named_tensors(self.whole_module(model))
        mine = self.local_names(model)
        if mine is not None:
            want = {k: t for k, t in want.items() if k in mine}
        with TensorReader(directory, "model") as reader, torch.no_grad():
            missing = [k for k in want if not reader.has(k)]
            if missing and strict:
                raise KeyError(
                    f"{directory}: missing {missing[:5]}{' ...' if len(missing) > 5 else ''}: "
                    "a checkpoint of another model?"
                )
            for k, t in want.items():
                if reader.has(k):
                    src = reader.get(k)
                    if src.shape != t.shape:
                        raise ValueError(
                            f"{directory}: {k!r} has shape {list(src.shape)}, the model {list(t.shape)}"
                        )
                    t.copy_(src)

    # -- optimizer ------------------------------------------------------------
    def model_of(self, optimizer: Any) -> Any:
        """The boosted model an optimizer steps."""
        return optimizer.model

    def state_layout(self, model: Any) -> WholeStates:
        return WholeStates()

    def param_names(self, model: Any) -> dict[int, str]:
        """Parameter names (a tied one under its first name) in the model as given to boost()."""
        return {id(p): n for n, p in self.whole_module(model).named_parameters()}

    def optimizer_files(self, optimizer: Any) -> OptimizerFiles:
        optim, model = optimizer.optim, self.model_of(optimizer)
        layout = self.state_layout(model)
        names = self.param_names(model)
        params, plan, work = {}, [], []
        for gi, g in enumerate(optim.param_groups):
            for p in g["params"]:
                state = optim.state.get(p, {})
                step = int(state["step"]) if "step" in state else (1 if state else 0)
                params[names[id(p)]] = {"group": gi, "step": step}
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
        )

    def write_optimizer(self, optimizer: Any, directory: Path, max_shard_bytes: int) -> None:
        files = self.optimizer_files(optimizer)
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
            )

    def read_optimizer(self, optimizer: Any, directory: Path) -> None:
        meta = read_meta(directory)
        optim, model = optimizer.optim, self.model_of(optimizer)
        if meta["kind"] != optimizer_kind(optim):
            raise ValueError(
                f"{directory} holds {meta['kind']} states but the optimizer is "
                f"{type(optim).__name__}; build the same kind of optimizer as the one that saved it"
            )
        layout = self.state_layout(model)
        names = self.param_names(model)
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
                        if "exp_avg" in entry:
                            entry["step"] = torch.tensor(float(saved["step"]))
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
        scaler = getattr(optimizer, "scaler", None)
        if scaler is not None and meta.get("grad_scaler"):
            scaler.load_state_dict(meta["grad_scaler"])
        loss_scaler = getattr(optimizer, "loss_scaler", None)
        if loss_scaler is not None and meta.get("loss_scale"):
            loss_scaler.load_state_dict(meta["loss_scale"])
