"""Model, optimizer and scheduler files for every plugin, in one layout-free form.

Model: safetensors keyed by parameter name (a single file, or files of at most
size_per_shard MiB with model.safetensors.index.json: the layout transformers
reads). Optimizer: optimizer.json plus "<param name>::<state>" tensors (see
megalith_zero.full_optimizer). Scheduler: its state_dict as JSON. Nothing is
pickled, and since nothing depends on the world size or the plugin, a checkpoint
written under one loads under another.

A tensor-parallel model's shards (parameters and optimizer states) are gathered
over the tp group to the full tensors, one at a time as the writer takes them,
and on loading each rank takes its shard (ShardSpec.take); under ZeRO the same
is done chunk by chunk through megalith_zero's full checkpoints with tp_layout.py. So tp 2 files load at tp 1 and back.
A pipelined model's (pp_size > 1) stages write the same files: pipeline_io.py collects
them on rank 0, and names a stage's parameters (and ZeRO's) by the whole model.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

import megalith_core.safetensors_files as files
from megalith_core.optim.rules import rule_for

from . import pipeline_io
from .plugin.base import require, world
from .plugin.hybrid_pipeline import PipelineModel
from .plugin.zero import ZeroModelWrapper, ZeroOptimizerWrapper
from .tp_layout import tp_layout

SEP = "::"


def _zero():
    return require("megalith_zero", "megalith-zero", "reading and writing megalith checkpoints")


def _barrier() -> None:
    import megalith_comm as comm

    comm.barrier()


def _named_state(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Parameters (tied ones once, under their first name) and persistent buffers."""
    out = {n: p.detach() for n, p in module.named_parameters()}
    persistent = module.state_dict(keep_vars=True).keys()
    out.update({n: b.detach() for n, b in module.named_buffers() if n in persistent})
    return out


def _tensor_parallel(model: Any) -> bool:
    """True for a tensor-parallel model: its files hold the full tensors, gathered over
    the tp group (and under ZeRO over dp: tp_layout.py)."""
    raw = model.whole if isinstance(model, PipelineModel) else model.unwrap()
    return getattr(raw, "tp_info", None) is not None


def _zero_layout(zmodel: Any) -> Any:
    """How a ZeRO model's parameters map to whole tensors in the files."""
    if getattr(zmodel.module, "tp_info", None) is not None:
        return tp_layout(zmodel)
    return _zero().file_layout.IDENTITY


def _tp_full_state(raw: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Full tensors of a tensor-parallel model, tied ones once (under their first name)."""
    from megalith.tensor_parallel.state import full_state_dict

    full = full_state_dict(raw)
    first: dict[int, str] = {}
    for name, t in raw.state_dict(keep_vars=True).items():
        first.setdefault(id(t), name)
    keep = set(first.values())
    return {k: v for k, v in full.items() if k in keep}


def save_model(model: Any, checkpoint: str, shard: bool, size_per_shard: int) -> None:
    zero = _zero()
    path = Path(checkpoint)
    max_bytes = size_per_shard << 20 if shard else 1 << 62
    target = path if shard else Path(tempfile.mkdtemp(prefix=".save-", dir=path.parent or "."))
    rank0 = world().rank == 0
    try:
        if isinstance(model, ZeroModelWrapper):
            zero.save_full(model.module, target, max_bytes, layout=_zero_layout(model.module))
        else:
            raw = model.unwrap()
            if isinstance(model, PipelineModel):
                raw = model.whole
                state = _tp_full_state(raw) if _tensor_parallel(model) else _named_state(raw)
                state = pipeline_io.full_state(model, state)
            else:
                state = _tp_full_state(raw) if _tensor_parallel(model) else _named_state(raw)
            tensors = {k: v.cpu() for k, v in state.items()}
            plan = [(k, t.numel() * t.element_size()) for k, t in tensors.items()]
            out = files.StreamedFiles(target, "model", plan, max_bytes, write=rank0)
            for k, t in tensors.items():
                out.add(k, t)
            out.finish()
            _barrier()
        raw = model.whole if isinstance(model, PipelineModel) else model.unwrap()
        if (
            shard and rank0 and hasattr(raw, "to_hf_config")
        ):  # transformers' from_pretrained reads it
            files.atomic_json(raw.to_hf_config(), target / "config.json")
        if not shard and rank0:
            os.replace(target / "model.safetensors", path)
    finally:
        if not shard and rank0:
            shutil.rmtree(target, ignore_errors=True)
    _barrier()


def load_model(model: Any, checkpoint: str, strict: bool = True) -> None:
    zero = _zero()
    path = Path(checkpoint)
    if path.is_file():  # a single .safetensors file: read it through a one-file view
        tmp = Path(tempfile.mkdtemp(prefix=".load-"))
        os.symlink(path.resolve(), tmp / "model.safetensors")
        try:
            return load_model(model, str(tmp), strict)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    if _tensor_parallel(model):
        from megalith.tensor_parallel.state import load_full_state_dict

        pipelined = isinstance(model, PipelineModel)
        raw = model.whole if pipelined else model.unwrap()
        wanted = pipeline_io.local_names(model) if pipelined else None
        names: dict[int, list[str]] = {}
        for name, t in raw.state_dict(keep_vars=True).items():
            if wanted is None or name in wanted:
                names.setdefault(id(t), []).append(name)
        with files.TensorReader(path, "model") as reader:
            state = {}
            for aliases in names.values():  # a tied tensor is in the files under one of its names
                stored = next((n for n in aliases if reader.has(n)), None)
                if stored is not None:
                    state.update({n: reader.get(stored) for n in aliases})
        missing = [n for aliases in names.values() for n in aliases if n not in state]
        if missing and strict:
            raise KeyError(f"{path}: missing {missing[:5]}: a checkpoint of another model?")
        load_full_state_dict(raw, state, strict=strict and not pipelined)
        return None
    if isinstance(model, ZeroModelWrapper):
        zmodel = model.module
        zero.load_full(zmodel, zmodel.optimizer, path, layout=_zero_layout(zmodel))
        return None
    module = model.whole if isinstance(model, PipelineModel) else model.unwrap()
    with files.TensorReader(path, "model") as reader, torch.no_grad():
        want = _named_state(module)
        if isinstance(model, PipelineModel):  # this rank's stages only
            mine = pipeline_io.local_names(model)
            want = {k: t for k, t in want.items() if k in mine}
        missing = [k for k in want if not reader.has(k)]
        if missing and strict:
            raise KeyError(
                f"{path}: missing {missing[:5]}{' ...' if len(missing) > 5 else ''}: a checkpoint of another model?"
            )
        for k, t in want.items():
            if reader.has(k):
                src = reader.get(k)
                if src.shape != t.shape:
                    raise ValueError(
                        f"{path}: {k!r} has shape {list(src.shape)}, the model {list(t.shape)}"
                    )
                t.copy_(src)
    return None


def _kind(optim: torch.optim.Optimizer) -> str:
    """The kind of states an optimizer holds (megalith_core.optim.rules)."""
    try:
        return rule_for(optim).kind
    except ValueError as exc:
        raise ValueError(f"saving {type(optim).__name__}: {exc}") from None


def _model_of(optimizer: Any) -> Any:
    """The boosted model an optimizer steps: its pipeline model when pipelined."""
    return getattr(optimizer, "pipeline_model", None) or getattr(optimizer, "model", None)


def _tp_group(model: Any) -> Any:
    """The tensor-parallel group of a boosted model, or None."""
    raw = model.whole if isinstance(model, PipelineModel) else model.unwrap()
    info = getattr(raw, "tp_info", None)
    return info.group if info is not None else None


def _param_names(model: Any) -> dict[int, str]:
    """Parameter names (a tied one under its first name) in the model as given to boost()."""
    raw = model.whole if isinstance(model, PipelineModel) else model.unwrap()
    return {id(p): n for n, p in raw.named_parameters()}


def _full(t: torch.Tensor, p: torch.Tensor, tp: Any) -> torch.Tensor:
    """The full fp32 state of parameter p from this rank's piece t (gathered over tp)."""
    from megalith.tensor_parallel.state import gather_full

    t = t.detach().float()
    spec = getattr(p, "tp_spec", None)
    return (gather_full(t, tp, spec) if spec is not None else t).cpu()


def _local(full: torch.Tensor, spec: Any, tp: Any) -> torch.Tensor:
    """This rank's tp shard of a full state (the tensor itself for a replicated parameter)."""
    return spec.take(full, tp.rank, tp.size) if spec is not None else full


def _pipeline_layout(model: PipelineModel, zopt: Any) -> Any:
    """ZeRO's file layout for a pipeline stage: tp shards, named by the whole model."""
    files = pipeline_io.stage_file_names(model)
    return tp_layout(zopt.model, tp=model.mesh.group("tp"), file_names=files)


def _plain_states(optimizer: Any) -> tuple[list, dict, Iterator[tuple[str, torch.Tensor]]]:
    """A torch optimizer's (plan, params, full states): see megalith_zero.full_optimizer."""
    optim, model = optimizer.optim, _model_of(optimizer)
    tp = _tp_group(model)
    names = _param_names(model)
    params, plan, work = {}, [], []
    for gi, g in enumerate(optim.param_groups):
        for p in g["params"]:
            state = optim.state.get(p, {})
            step = int(state["step"]) if "step" in state else (1 if state else 0)
            params[names[id(p)]] = {"group": gi, "step": step}
            parts = tp.size if tp is not None and hasattr(p, "tp_spec") else 1
            for k, v in state.items():
                if k != "step" and torch.is_tensor(v):
                    key = f"{names[id(p)]}{SEP}{k}"
                    work.append((key, v, p))
                    plan.append((key, v.numel() * 4 * parts))
    return plan, params, ((key, _full(v, p, tp)) for key, v, p in work)


def save_optimizer(optimizer: Any, checkpoint: str, shard: bool, size_per_shard: int) -> None:
    """Collective; rank 0 writes. A tensor-parallel model's states are gathered over the
    tp group one tensor at a time as the writer takes them (never all at once); a
    pipelined model's stages are collected on rank 0 first (pipeline_io.py)."""
    zero = _zero()
    path = Path(checkpoint)
    max_bytes = size_per_shard << 20 if shard else 1 << 62
    model = _model_of(optimizer)
    pipelined = isinstance(model, PipelineModel)
    if isinstance(optimizer, ZeroOptimizerWrapper) and not pipelined:
        zopt = optimizer.optim
        layout = _zero_layout(zopt.model)
        zero.save_full_optimizer(zopt.model, zopt, path, max_bytes, layout=layout)
        return
    if isinstance(optimizer, ZeroOptimizerWrapper):
        zopt = optimizer.optim
        zopt.reducer.wait()
        layout = _pipeline_layout(model, zopt)
        plan, params = zero.full_optimizer.full_plan(zopt, layout)
        states = zero.full_optimizer.full_states(zopt, layout)
        kind, groups, scaler = zopt.rule.kind, zopt.optimizer.param_groups, None
        loss_scaler = zopt.scaler
    else:
        plan, params, states = _plain_states(optimizer)
        kind, groups = _kind(optimizer.optim), optimizer.optim.param_groups
        scaler = getattr(optimizer, "scaler", None)  # torch's GradScaler (TorchDDPPlugin)
        loss_scaler = getattr(optimizer, "loss_scaler", None)  # megalith_zero's (Hybrid)
    if pipelined:
        plan, params, tensors = pipeline_io.full_optimizer_states(model, plan, params, states, SEP)
        states = iter(tensors.items())
    rank0 = world().rank == 0
    out = files.StreamedFiles(path, "optimizer", plan, max_bytes, write=rank0)
    for key, t in states:
        out.add(key, t)
    out.finish()
    if rank0:
        meta = {
            "format": zero.full_optimizer.FORMAT,
            "kind": kind,
            "param_groups": zero.full_optimizer.hyperparameters(groups),
            "params": params,
            # the scale in megalith_zero's form (a ZeRO plugin reads it) and GradScaler's own state
            "loss_scale": loss_scaler.state_dict()
            if loss_scaler is not None
            else {"scale": float(scaler.get_scale()), "clean_steps": 0}
            if scaler
            else None,
            "grad_scaler": dict(scaler.state_dict()) if scaler else None,
        }
        files.atomic_json(meta, path / "optimizer.json")
    _barrier()


def load_optimizer(optimizer: Any, checkpoint: str) -> None:
    """A tensor-parallel model's ranks each take their shard of every full state; a
    pipelined model's ranks read their stages' parameters only."""
    zero = _zero()
    path = Path(checkpoint)
    model = _model_of(optimizer)
    if isinstance(optimizer, ZeroOptimizerWrapper):
        zopt = optimizer.optim
        if isinstance(model, PipelineModel):
            layout = _pipeline_layout(model, zopt)
        else:
            layout = _zero_layout(zopt.model)
        zero.load_full_optimizer(zopt.model, zopt, path, layout=layout)
        return  # with the loss scale: load_full_optimizer reads it
    meta = zero.full_optimizer.read_meta(path)
    optim = optimizer.optim
    if meta["kind"] != _kind(optim):
        raise ValueError(
            f"{path} holds {meta['kind']} states but the optimizer is {type(optim).__name__}; "
            "build the same kind of optimizer as the one that saved it"
        )
    tp = _tp_group(model)
    names = _param_names(model)
    state: dict[int, dict[str, Any]] = {}
    groups = []
    index = 0
    with files.TensorReader(path, "optimizer") as reader:
        keys = list(reader.keys())
        for gi, g in enumerate(optim.param_groups):
            ids = []
            for p in g["params"]:
                name = names[id(p)]
                saved = meta["params"].get(name, {"step": 0})
                spec = getattr(p, "tp_spec", None) if tp is not None else None
                entry = {
                    k.split(SEP, 1)[1]: _local(reader.get(k), spec, tp).to(p.device)
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
            groups.append({**{k: v for k, v in g.items() if k != "params"}, **hyper, "params": ids})
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
    _barrier()


def save_lr_scheduler(lr_scheduler: Any, checkpoint: str) -> None:
    if world().rank == 0:
        state = lr_scheduler.state_dict()
        try:
            text = json.dumps(state)
        except TypeError as e:
            raise TypeError(
                f"{type(lr_scheduler).__name__}'s state_dict is not JSON-serialisable ({e}); "
                "megalith does not pickle checkpoints"
            ) from None
        path = Path(checkpoint)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(text)
        os.replace(tmp, path)
    _barrier()


def load_lr_scheduler(lr_scheduler: Any, checkpoint: str) -> None:
    lr_scheduler.load_state_dict(json.loads(Path(checkpoint).read_text()))
