"""Layout-free model and optimizer files of a tensor-parallel model under ZeRO.

HybridParallelPlugin(zero_stage=1 or 2) hands megalith_zero a model whose
parameters are already tp shards, so a ZeRO chunk holds dp shards of tp shards.
These functions write (and read) the same files as megalith_zero.save_full /
save_full_optimizer, i.e. full tensors keyed by parameter name:

  save: one chunk at a time, all-gathered over dp (as megalith_zero streams it),
        then each of its parameters all-gathered over tp and joined by its
        tp_spec; rank 0 hands it to megalith_zero's StreamedFiles, which writes
        a file as soon as its last tensor arrives. At most one chunk, one full
        parameter and one file's tensors are held, never the whole model.
  load: every rank reads the full tensor of each parameter its chunk segments
        touch, takes its tp shard (ShardSpec.take) and copies its dp slice. No
        communication beyond the gather of updated parameters at the end.

Every rank of the world calls them (the gathers are collective).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from .plugin.base import require, world

SEP = "::"


def _zero():
    return require("megalith_zero", "megalith-zero", "reading and writing megalith checkpoints")


def _tp(zmodel: Any) -> tuple[Any, dict[str, Any]]:
    """The tp group and every parameter's (and buffer's) ShardSpec or None, by name."""
    raw = zmodel.module
    specs = {n: getattr(t, "tp_spec", None) for n, t in raw.state_dict(keep_vars=True).items()}
    return raw.tp_info.group, specs


def _full_bytes(numel: int, spec: Any, tp_size: int, itemsize: int = 4) -> int:
    return numel * itemsize * (tp_size if spec is not None else 1)


def _local(full: torch.Tensor, spec: Any, tp: Any) -> torch.Tensor:
    """This rank's tp shard of a full tensor (the tensor itself when replicated)."""
    return spec.take(full, tp.rank, tp.size) if spec is not None else full


def _finish() -> None:
    import megalith_comm as comm

    comm.barrier()  # the world's: every rank took part in the gathers


def save_model(zmodel: Any, path: Path, max_bytes: int) -> None:
    from megalith.tensor_parallel.state import gather_full

    zero = _zero()
    tp, specs = _tp(zmodel)
    rank0 = world().rank == 0
    persistent = zmodel.module.state_dict(keep_vars=True).keys()
    buffers = [(n, b) for n, b in zmodel.module.named_buffers() if n in persistent]
    plan = [
        (s.name, _full_bytes(s.numel, specs.get(s.name), tp.size))
        for c in zmodel.chunks
        for s in c.spec.slots
    ]
    plan += [
        (n, _full_bytes(b.numel(), specs.get(n), tp.size, b.element_size())) for n, b in buffers
    ]
    out = zero.files.StreamedFiles(path, "model", plan, max_bytes, write=rank0)
    for name, t in zero.full_state.iter_full_params(zmodel.chunks, zmodel.group):
        out.add(name, gather_full(t, tp, specs.get(name)).cpu())
    for name, b in buffers:
        out.add(name, gather_full(b, tp, specs.get(name)).cpu())
    out.finish()
    _finish()


@torch.no_grad()
def load_model(zmodel: Any, path: Path) -> None:
    """Parameters from full tensors; optimizer states start fresh (as megalith_zero.load_full)."""
    zero = _zero()
    zopt = zmodel.optimizer
    tp, specs = _tp(zmodel)
    zopt.zero_grad()
    rank = zmodel.group.rank
    with zero.files.TensorReader(path, "model") as reader:
        for c in zmodel.chunks:
            dst_all = c.master if c.trainable else c.shard
            for seg in c.spec.segments(rank):
                name = seg.slot.name
                src = reader.get(name)
                spec = specs.get(name)
                want = spec.full_shape(seg.slot.shape) if spec is not None else seg.slot.shape
                if tuple(src.shape) != tuple(want):
                    raise ValueError(
                        f"{path}: {name!r} has shape {list(src.shape)}, the unsharded model "
                        f"{list(want)}: a checkpoint of another model"
                    )
                flat = _local(src, spec, tp).reshape(-1)
                dst_all[seg.shard_start : seg.shard_start + seg.length].copy_(
                    flat[seg.param_start : seg.param_start + seg.length]
                )
            if c.trainable and c.master.data_ptr() != c.shard.data_ptr():
                c.shard.copy_(c.master)
            for st in c.states.values():
                st.zero_()
            c.steps = [0] * len(c.spec.slots)
        for name, b in zmodel.module.named_buffers():
            if reader.has(name):
                b.copy_(_local(reader.get(name), specs.get(name), tp))
    zopt._gather_params(zmodel.chunks)
    _finish()


def save_optimizer(zopt: Any, path: Path, max_bytes: int) -> None:
    import megalith_comm as comm
    from megalith.tensor_parallel.state import gather_full

    zero = _zero()
    zmodel = zopt.model
    tp, specs = _tp(zmodel)
    rank0 = world().rank == 0
    zopt.reducer.wait()
    names_of = {gi: zopt.rule.state_names(g) for gi, g in enumerate(zopt.optimizer.param_groups)}
    plan, params = [], {}
    for c in zopt.trainable:
        for s, step in zip(c.spec.slots, c.steps):
            params[s.name] = {"group": c.spec.group, "step": step}
            if step:  # torch keeps no state for a parameter that never stepped
                size = _full_bytes(s.numel, specs.get(s.name), tp.size)
                plan += [(f"{s.name}{SEP}{n}", size) for n in names_of[c.spec.group]]
    out = zero.files.StreamedFiles(path, "optimizer", plan, max_bytes, write=rank0)
    for c in zopt.trainable:
        if not any(c.steps):
            continue
        names = names_of[c.spec.group]
        c.ensure_states(names)
        for state in names:
            full = torch.empty(c.spec.numel, dtype=torch.float32, device=c.shard.device)
            comm.all_gather(full, c.states[state].to(c.shard.device), group=zmodel.group)
            for s, step in zip(c.spec.slots, c.steps):
                if step:
                    shard = full[s.offset : s.offset + s.numel].view(s.shape)
                    out.add(
                        f"{s.name}{SEP}{state}", gather_full(shard, tp, specs.get(s.name)).cpu()
                    )
    out.finish()
    if rank0:
        meta = {
            "format": zero.full_optimizer.FORMAT,
            "kind": zopt.rule.kind,
            "param_groups": zero.full_optimizer.hyperparameters(zopt.optimizer.param_groups),
            "params": params,
            "loss_scale": zopt.scaler.state_dict() if zopt.scaler else None,
        }
        zero.files.atomic_json(meta, path / "optimizer.json")
    _finish()


@torch.no_grad()
def load_optimizer(zopt: Any, path: Path) -> None:
    zero = _zero()
    zmodel = zopt.model
    tp, specs = _tp(zmodel)
    meta = zero.full_optimizer.read_meta(path)
    if meta["kind"] != zopt.rule.kind:
        raise ValueError(
            f"{path} holds {meta['kind']} optimizer states but the optimizer is {zopt.rule.kind}; "
            "build the same kind of optimizer as the one that saved it"
        )
    rank = zmodel.group.rank
    with zero.files.TensorReader(path, "optimizer") as reader:
        for c in zopt.trainable:
            names = zopt.rule.state_names(zopt.optimizer.param_groups[c.spec.group])
            c.ensure_states(names)
            for st in c.states.values():
                st.zero_()
            c.steps = [int(meta["params"].get(s.name, {}).get("step", 0)) for s in c.spec.slots]
            for seg in c.spec.segments(rank):
                for n in names:
                    key = f"{seg.slot.name}{SEP}{n}"
                    if not reader.has(key):
                        continue
                    local = _local(reader.get(key), specs.get(seg.slot.name), tp).reshape(-1)
                    c.states[n][seg.shard_start : seg.shard_start + seg.length].copy_(
                        local[seg.param_start : seg.param_start + seg.length]
                    )
    for group, saved in zip(zopt.optimizer.param_groups, meta["param_groups"]):
        for key, value in saved.items():
            group[key] = tuple(value) if isinstance(value, list) else value
    if zopt.scaler is not None and meta.get("loss_scale"):
        zopt.scaler.load_state_dict(meta["loss_scale"])
    _finish()
