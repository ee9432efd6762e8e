"""ZeRO's optimizer states in the layout-free form of megalith_core.optimizer_files.

Nothing in it depends on the world size, the ZeRO stage or the chunking, so it
loads under any of them, and megalith's Booster writes the same form for plain
data-parallel training: a checkpoint moves between plugins. Written by rank 0,
gathered one chunk at a time (streamed: never the whole state in memory).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import torch

import megalith_comm as comm
from megalith_core.optim import flat_states
from megalith_core.optimizer_files import SEP, read_meta, restore_hyperparameters, write_meta
from megalith_core.safetensors_files import StreamedFiles, TensorReader

from .api import ZeroModel
from .file_layout import IDENTITY, FileLayout
from .full_state import agree_written, keep_formats
from .offload import with_resident_states
from .optimizer import ZeroOptimizer


def full_plan(
    zopt: ZeroOptimizer, layout: FileLayout = IDENTITY
) -> tuple[list[tuple[str, int]], dict[str, dict[str, int]]]:
    """The files' keys with their fp32 byte counts, in the order full_states yields them,
    and optimizer.json's "params" (group and step per parameter), under layout's names."""
    names_of = {gi: zopt.rule.state_names(g) for gi, g in enumerate(zopt.optimizer.param_groups)}
    plan, params = [], {}
    for c in zopt.trainable:
        for s, step in zip(c.spec.slots, c.steps):
            params[layout.file_name(s.name)] = {"group": c.spec.group, "step": step}
        for state in names_of[c.spec.group] if any(c.steps) else ():
            for s, step in zip(c.spec.slots, c.steps):
                if step:  # torch keeps no state for a parameter that never stepped
                    size = layout.full_numel(s.name, s.numel) * 4
                    plan.append((f"{layout.file_name(s.name)}{SEP}{state}", size))
    return plan, params


def full_states(
    zopt: ZeroOptimizer, layout: FileLayout = IDENTITY
) -> Iterator[tuple[str, torch.Tensor]]:
    """Collective over ZeRO's group (and layout's): every full state as a CPU tensor, in
    full_plan's order, gathered one chunk and one state at a time."""
    group = zopt.model.group
    names_of = {gi: zopt.rule.state_names(g) for gi, g in enumerate(zopt.optimizer.param_groups)}
    for c in zopt.trainable:
        if not any(c.steps):
            continue
        c.ensure_states(names_of[c.spec.group])
        # lean states go into the files as fp32 (the format is the param group's
        # state_dtype in optimizer.json); decoded one chunk at a time
        values = flat_states.to_fp32(c.states) if c.state_dtype != "fp32" else c.states
        for state in names_of[c.spec.group]:
            device = c.shard.device  # offloaded states are on the host: gather where comm is
            full = torch.empty(c.spec.numel, dtype=torch.float32, device=device)
            comm.all_gather(full, values[state].to(device), group=group)
            for s, step in zip(c.spec.slots, c.steps):
                if step:
                    part = full[s.offset : s.offset + s.numel].view(s.shape)
                    key = f"{layout.file_name(s.name)}{SEP}{state}"
                    yield key, layout.to_full(s.name, part).cpu()


@with_resident_states
def save_full_optimizer(
    zmodel: ZeroModel,
    zopt: ZeroOptimizer,
    path: str | os.PathLike,
    max_shard_bytes: int = 5 << 30,
    layout: FileLayout = IDENTITY,
) -> None:
    """Collective; rank 0 writes. `layout`: see file_layout.py."""
    path = Path(path)
    rank0 = layout.writes(zmodel.group)
    zopt.reducer.wait()
    plan, params = full_plan(zopt, layout)
    out = StreamedFiles(path, "optimizer", plan, max_shard_bytes, write=rank0)
    error = None  # a failed write stops the writing, not the gathers the others are in
    for key, tensor in full_states(zopt, layout):
        if error is None:
            try:
                out.add(key, tensor)
            except Exception as e:
                error = e
    if error is None and rank0:
        try:
            out.finish()
            loss_scale = zopt.scaler.state_dict() if zopt.scaler else None
            write_meta(path, zopt.rule.kind, zopt.optimizer.param_groups, params, loss_scale)
        except Exception as e:
            error = e
    agree_written(zmodel.group, error)
    layout.barrier(zmodel.group)


@with_resident_states
def load_full_optimizer(
    zmodel: ZeroModel,
    zopt: ZeroOptimizer,
    path: str | os.PathLike,
    layout: FileLayout = IDENTITY,
) -> None:
    """Each rank reads the slices of every state its shards hold; collective."""
    path = Path(path)
    meta = read_meta(path)
    if meta["kind"] != zopt.rule.kind:
        raise ValueError(
            f"{path} holds {meta['kind']} optimizer states but the optimizer is {zopt.rule.kind}; "
            "build the same kind of optimizer as the one that saved it"
        )
    rank = zmodel.group.rank
    with TensorReader(path, "optimizer") as reader, torch.no_grad():
        for c in zopt.trainable:
            names = zopt.rule.state_names(zopt.optimizer.param_groups[c.spec.group])
            c.ensure_states(names)
            for st in c.states.values():
                st.zero_()
            lean = c.state_dtype != "fp32"
            values = (
                {n: torch.zeros(c.spec.shard_numel, device=c.master.device) for n in names}
                if lean
                else c.states
            )
            c.steps = [
                int(meta["params"].get(layout.file_name(s.name), {}).get("step", 0))
                for s in c.spec.slots
            ]
            for seg in c.spec.segments(rank):
                for n in names:
                    key = f"{layout.file_name(seg.slot.name)}{SEP}{n}"
                    if reader.has(key):
                        src = layout.to_local(seg.slot.name, reader.get(key)).reshape(-1)
                        src = src[seg.param_start : seg.param_start + seg.length]
                        values[n][seg.shard_start : seg.shard_start + seg.length].copy_(src)
            if lean:  # fp32 from the files into the chunk's format
                flat_states.write_fp32(c.states, values)
    keep_formats(zopt, lambda: restore_hyperparameters(zopt.optimizer.param_groups, meta))
    if zopt.scaler is not None and meta.get("loss_scale"):
        zopt.scaler.load_state_dict(meta["loss_scale"])
    layout.barrier(zmodel.group)
