"""Checkpoints: sharded (each rank writes its own shard) and full (safetensors, streamed).

Sharded layout of a checkpoint directory:
    zero_meta.json           the layout (chunks, slots, world size), per-parameter
                             step counts, loss scale, optimizer hyperparameters
    rank00000.safetensors    rank 0's "c<k>.master", "c<k>.<state>" (and "c<k>.params"
    rank00001.safetensors    for frozen chunks), one tensor per chunk
A checkpoint written at world size N loads at any M: the loader maps each of its
shard segments (parameter name, element range) onto the pieces of the old shards
that hold it and reads just those slices.

Every file is written atomically (megalith_core.atomic_files: a temporary name, fsync,
rename, fsync of the directory); rank 0 writes zero_meta.json last, after a barrier, so
a directory without it (a crash mid-save) is never taken for a checkpoint.
"""

from __future__ import annotations

import functools
import json
import os
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import torch

import megalith_comm as comm
from megalith_core.optim import flat_states
from megalith_core.optimizer_files import restore_hyperparameters
from megalith_core.safetensors_files import (
    StreamedFiles,
    TensorReader,
    atomic_json,
    atomic_save,
    safe_open,
)

from .api import ZeroModel
from .chunk import FlatChunk
from .file_layout import IDENTITY, FileLayout
from .full_state import agree_written, iter_full_params, keep_formats
from .layout import Chunk, Slot
from .offload import with_resident_states
from .optimizer import ZeroOptimizer

META = "zero_meta.json"
FORMAT = 1


def _rank_file(rank: int) -> str:
    return f"rank{rank:05d}.safetensors"


def _layout_meta(zmodel: ZeroModel, zopt: ZeroOptimizer) -> dict[str, Any]:
    steps = {}
    for c in zmodel.chunks:
        for s, n in zip(c.spec.slots, c.steps):
            steps[s.name] = n
    groups = [{k: v for k, v in g.items() if k != "params"} for g in zopt.optimizer.param_groups]
    return {
        "format": FORMAT,
        "world": zmodel.layout.world,
        "stage": zopt.config.stage,
        "precision": str(zopt.config.param_dtype),
        "rule": zopt.rule.kind,
        "chunks": [
            {
                "group": c.spec.group,
                "numel": c.spec.numel,
                "slots": [[s.param, s.name, list(s.shape), s.offset] for s in c.spec.slots],
            }
            for c in zmodel.chunks
        ],
        "steps": steps,
        # the format of each chunk's c<k>.<state> tensors ([Note: lean chunk states])
        "state_dtypes": [c.state_dtype for c in zmodel.chunks],
        "loss_scale": zopt.scaler.state_dict() if zopt.scaler else None,
        "param_groups": groups,
    }


@with_resident_states
def save_sharded(zmodel: ZeroModel, zopt: ZeroOptimizer, path: str | os.PathLike) -> None:
    """Every rank of the group writes its shards; collective."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    zopt.reducer.wait()
    rank = zmodel.group.rank
    tensors: dict[str, torch.Tensor] = {}
    for c in zmodel.chunks:
        k = c.spec.index
        if c.trainable:
            tensors[f"c{k}.master"] = c.master
            for name, t in c.states.items():
                tensors[f"c{k}.{name}"] = t
        else:
            tensors[f"c{k}.params"] = c.shard
    agree_written(zmodel.group, _attempt(lambda: atomic_save(tensors, path / _rank_file(rank))))
    if rank == 0:
        error = _attempt(lambda: atomic_json(_layout_meta(zmodel, zopt), path / META))
    agree_written(zmodel.group, error if rank == 0 else None)


class _OldShards:
    """Reads element ranges of parameters out of a sharded checkpoint of any world size."""

    def __init__(self, path: Path, meta: dict[str, Any], files: ExitStack):
        self.path = path
        self.files = files
        self._open: dict[int, Any] = {}
        self.pieces: dict[str, list[tuple[int, int, int, int, int]]] = {}
        self.shapes: dict[str, tuple[int, ...]] = {}
        world = self.world = meta["world"]
        self.chunks = meta["chunks"]
        self.formats: list[str] = meta.get("state_dtypes", [])
        self._decoded: dict[tuple[int, int, str], torch.Tensor] = {}
        for k, c in enumerate(meta["chunks"]):
            slots = tuple(Slot(p, name, tuple(shape), off) for p, name, shape, off in c["slots"])
            chunk = Chunk(k, c["group"], c["numel"], slots, world)
            for s in slots:
                self.shapes[s.name] = s.shape
            for r in range(world):
                for seg in chunk.segments(r):
                    self.pieces.setdefault(seg.slot.name, []).append(
                        (r, k, seg.shard_start, seg.param_start, seg.length)
                    )

    def _file(self, rank: int) -> Any:
        if rank not in self._open:
            self._open[rank] = self.files.enter_context(safe_open(self.path / _rank_file(rank)))
        return self._open[rank]

    def state_dtype(self, k: int) -> str:
        return self.formats[k] if k < len(self.formats) else "fp32"

    def same_chunk(self, c: FlatChunk, world: int) -> bool:
        """Whether old chunk c.spec.index is this chunk at this world size, its states in
        the chunk's format: its tensors then load as they are (bit for bit)."""
        k = c.spec.index
        if self.world != world or k >= len(self.chunks) or self.state_dtype(k) != c.state_dtype:
            return False
        old = self.chunks[k]
        return old["numel"] == c.spec.numel and old["slots"] == [
            [s.param, s.name, list(s.shape), s.offset] for s in c.spec.slots
        ]

    def raw(self, rank: int, k: int, name: str) -> torch.Tensor | None:
        """Tensor c<k>.<name> of rank's file as written, or None."""
        f = self._file(rank)
        return f.get_tensor(f"c{k}.{name}") if f"c{k}.{name}" in f.keys() else None

    def _fp32(self, r: int, k: int, kind: str) -> Any:
        """Old shard (r, k)'s state `kind` as fp32 (q8 codes decoded with their scales)."""
        if self.state_dtype(k) == "fp32" or kind in ("master", "params"):
            return self._file(r).get_slice(f"c{k}.{kind}")
        key = (r, k, kind)
        if key not in self._decoded:
            names = ("exp_avg", "exp_avg_sq") if kind in flat_states.LEAN_NAMES else (kind,)
            stored = {
                n: self.raw(r, k, n) for n in flat_states.stored_names(names, self.state_dtype(k))
            }
            self._decoded = {key: flat_states.to_fp32(stored)[kind]}  # one shard at a time
        return self._decoded[key]

    def has(self, name: str, kind: str) -> bool:
        r, k, *_ = self.pieces[name][0]
        return f"c{k}.{kind}" in self._file(r).keys()

    def read(self, name: str, kind: str, start: int, length: int, out: torch.Tensor) -> None:
        """Elements [start, start + length) of parameter `name`'s `kind` into `out`."""
        if name not in self.pieces:
            raise KeyError(f"checkpoint {self.path} has no parameter {name!r}")
        stop = start + length
        for r, k, shard_start, p_start, n in self.pieces[name]:
            a, b = max(start, p_start), min(stop, p_start + n)
            if a >= b:
                continue
            src = self._fp32(r, k, kind)
            lo = shard_start + (a - p_start)
            out[a - start : b - start].copy_(src[lo : lo + (b - a)])


@with_resident_states
def load_sharded(zmodel: ZeroModel, zopt: ZeroOptimizer, path: str | os.PathLike) -> None:
    """Loads a checkpoint written by save_sharded at any world size; collective."""
    path = Path(path)
    meta_path = path / META
    if not meta_path.exists():
        raise FileNotFoundError(
            f"{path} is not a megalith_zero sharded checkpoint ({META} is missing; a save that "
            "crashed leaves none, so load the previous checkpoint)"
        )
    meta = json.loads(meta_path.read_text())
    if meta.get("format") != FORMAT:
        raise ValueError(
            f"{meta_path}: format {meta.get('format')}; this megalith_zero reads format {FORMAT}"
        )
    if meta["rule"] != zopt.rule.kind:
        raise ValueError(
            f"{path} holds {meta['rule']} optimizer states but the optimizer is {zopt.rule.kind}; "
            "build the same kind of optimizer as the one that saved it"
        )
    zmodel.wait_params()  # no gather of the last step may land on the loaded values
    zopt.zero_grad()
    if zmodel.stage3 is not None:
        zmodel.stage3.end_step()
    rank = zmodel.group.rank
    with ExitStack() as files:
        old = _OldShards(path, meta, files)
        for c in zmodel.chunks:
            for s in c.spec.slots:
                if tuple(old.shapes.get(s.name, ())) != s.shape:
                    raise ValueError(
                        f"{path}: parameter {s.name!r} has shape {list(old.shapes.get(s.name, ()))} "
                        f"there but {list(s.shape)} in the model: a checkpoint of another model"
                    )
            with torch.no_grad():
                for seg in c.spec.segments(rank):
                    dst = slice(seg.shard_start, seg.shard_start + seg.length)
                    if not c.trainable:
                        old.read(seg.slot.name, "params", seg.param_start, seg.length, c.shard[dst])
                        continue
                    old.read(seg.slot.name, "master", seg.param_start, seg.length, c.master[dst])
                if c.trainable:
                    _load_states(c, zopt, old, rank)
                if c.trainable and c.master.data_ptr() != c.shard.data_ptr():
                    c.shard.copy_(c.master)
            c.steps = [int(meta["steps"].get(s.name, 0)) for s in c.spec.slots]
    keep_formats(zopt, lambda: restore_hyperparameters(zopt.optimizer.param_groups, meta))
    if zopt.scaler is not None and meta["loss_scale"] is not None:
        zopt.scaler.load_state_dict(meta["loss_scale"])
    if zopt.config.stage in (1, 2):
        zopt._gather_params(zmodel.chunks)
    comm.barrier(group=zmodel.group)


def _load_states(c: FlatChunk, zopt: ZeroOptimizer, old: _OldShards, rank: int) -> None:
    """Chunk c's optimizer states from the checkpoint: as written when the old chunk is
    this one in this format (resume: bit for bit), else each segment's fp32 values from
    the old shards holding it, stored in the chunk's format (converted, as the optimizer
    classes' load_state_dict does)."""
    names = zopt.rule.state_names(zopt.optimizer.param_groups[c.spec.group])
    c.ensure_states(names)
    k = c.spec.index
    if old.same_chunk(c, zopt.group.size):
        for n, t in c.states.items():
            src = old.raw(rank, k, n)
            if src is not None:
                t.copy_(src)
        return
    values = {n: torch.zeros(c.spec.shard_numel, dtype=torch.float32) for n in names}
    for seg in c.spec.segments(rank):
        dst = slice(seg.shard_start, seg.shard_start + seg.length)
        for n in names:
            if old.has(seg.slot.name, n):
                old.read(seg.slot.name, n, seg.param_start, seg.length, values[n][dst])
    flat_states.write_fp32(c.states, {n: v.to(c.states[n].device) for n, v in values.items()})


def save_full(
    zmodel: ZeroModel,
    path: str | os.PathLike,
    max_shard_bytes: int = 5 << 30,
    dtype: torch.dtype = torch.float32,
    layout: FileLayout = IDENTITY,
) -> None:
    """The whole model as safetensors files plus model.safetensors.index.json (the
    layout transformers reads), written by rank 0; collective. `layout`: see
    file_layout.py (parameters that are shards of larger tensors).

    Streamed: parameters are gathered one chunk at a time and each file is written
    as soon as its last parameter arrives, so at most one file's worth of tensors
    (max_shard_bytes) plus one chunk is ever held, never the whole model.
    """
    path = Path(path)
    writer = layout.writes(zmodel.group)
    itemsize = torch.empty((), dtype=dtype).element_size()
    plan = [
        (s.name, layout.full_numel(s.name, s.numel) * itemsize)
        for c in zmodel.chunks
        for s in c.spec.slots
    ]
    out = StreamedFiles(path, "model", plan, max_shard_bytes, write=writer)
    error = None  # a failed write stops the writing, not the gathers the others are in
    for name, tensor in iter_full_params(zmodel.chunks, zmodel.group):
        full = layout.to_full(name, tensor).to(dtype)  # a collective under a tp layout
        error = error or _attempt(functools.partial(out.add, name, full))
    persistent = zmodel.module.state_dict(keep_vars=True).keys()
    buffers = {
        n: layout.to_full(n, b.detach())
        for n, b in zmodel.module.named_buffers()
        if n in persistent
    }

    def rest() -> None:
        if writer and buffers:
            atomic_save(buffers, path / "buffers.safetensors", metadata={"format": "pt"})
        out.finish({n: "buffers.safetensors" for n in buffers} if writer else {})

    agree_written(zmodel.group, error or _attempt(rest))
    layout.barrier(zmodel.group)


def _attempt(write: Any) -> BaseException | None:
    """write()'s error, or None (agree_written then tells every rank)."""
    try:
        write()
    except Exception as e:
        return e
    return None


@with_resident_states
def load_full(
    zmodel: ZeroModel,
    zopt: ZeroOptimizer,
    path: str | os.PathLike,
    layout: FileLayout = IDENTITY,
) -> None:
    """Loads parameters from save_full's files (or any safetensors checkpoint with an
    index, e.g. transformers'); optimizer states start fresh. Each rank reads only the
    parameters its shards hold, one at a time; collective."""
    path = Path(path)
    zmodel.wait_params()  # no gather of the last step may land on the loaded values
    zopt.zero_grad()
    if zmodel.stage3 is not None:
        zmodel.stage3.end_step()
    rank = zmodel.group.rank
    with TensorReader(path, "model") as reader, torch.no_grad():
        for c in zmodel.chunks:
            dst_all = c.master if c.trainable else c.shard
            for seg in c.spec.segments(rank):
                name = seg.slot.name
                src = reader.get(name)
                want = layout.full_shape(name, seg.slot.shape)
                if tuple(src.shape) != want:
                    raise ValueError(
                        f"{path}: {name!r} has shape {list(src.shape)}, the model "
                        f"{list(want)}: a checkpoint of another model"
                    )
                flat = layout.to_local(name, src).reshape(-1)
                flat = flat[seg.param_start : seg.param_start + seg.length]
                dst_all[seg.shard_start : seg.shard_start + seg.length].copy_(flat)
            if c.trainable and c.master.data_ptr() != c.shard.data_ptr():
                c.shard.copy_(c.master)
            for st in c.states.values():
                st.zero_()
            c.steps = [0] * len(c.spec.slots)
        for name, b in zmodel.module.named_buffers():
            if reader.has(name):
                b.copy_(layout.to_local(name, reader.get(name)))
    if zopt.config.stage in (1, 2):
        zopt._gather_params(zmodel.chunks)
    layout.barrier(zmodel.group)
