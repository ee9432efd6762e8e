"""ZeroCheckpointIO: LowLevelZeroPlugin, GeminiPlugin, and HybridParallelPlugin's ZeRO
without a pipeline.

megalith_zero's full checkpoints do the work: parameters and optimizer states are
gathered over ZeRO's group one chunk at a time and streamed into the files (never
the whole model in memory), and on loading each rank reads the slices its shards
hold. A FileLayout says how ZeRO's parameters relate to the files' tensors: whole
ones (the identity), or tensor-parallel shards (tp_layout.py).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

from megalith_core.optimizer_files import hyperparameters
from megalith_core.safetensors_files import StreamedFiles, atomic_save

from ..plugin.base import require
from . import async_writes, zero_capture
from .base import CheckpointIO, Writer, is_writer
from .general import OptimizerFiles, write_optimizer_files
from .key_check import check_model_files


def _zero() -> Any:
    return require("megalith_zero", "megalith-zero", "ZeRO checkpoints")


def _whole(layout: Any) -> bool:
    """The layout's parameters are the files' whole tensors (no tensor parallelism)."""
    return type(layout) is _zero().file_layout.FileLayout


class ZeroCheckpointIO(CheckpointIO):
    """layout_for(zero_model) gives the FileLayout of a model's parameters; None: they
    are whole tensors."""

    def __init__(self, layout_for: Callable[[Any], Any] | None = None) -> None:
        self.layout_for = layout_for

    def layout(self, zmodel: Any) -> Any:
        return self.layout_for(zmodel) if self.layout_for else _zero().file_layout.IDENTITY

    def write_model(self, model: Any, directory: Path, max_shard_bytes: int) -> None:
        zmodel = model.module
        _zero().save_full(zmodel, directory, max_shard_bytes, layout=self.layout(zmodel))

    def read_model(self, model: Any, directory: Path, strict: bool) -> None:
        """Every parameter must be in the files (strict or not): ZeRO's chunks are whole.
        The keys and shapes are checked on every rank first (key_check.py)."""
        zmodel = model.module
        layout = self.layout(zmodel)
        params = {
            s.name: layout.full_shape(s.name, s.shape) for c in zmodel.chunks for s in c.spec.slots
        }
        names = zmodel.module.state_dict(keep_vars=True).keys()
        buffers = {n: None for n, _ in zmodel.module.named_buffers() if n in names}
        check_model_files(
            directory,
            {**buffers, **params},
            strict=strict,
            known=names,
            required=params,
            what=type(zmodel.module).__name__,
            why_required="ZeRO's chunks are whole: every parameter must be in the files, "
            "strict=False or not",
        )
        _zero().load_full(zmodel, zmodel.optimizer, directory, layout=self.layout(zmodel))

    def write_optimizer(self, optimizer: Any, directory: Path, max_shard_bytes: int) -> None:
        zopt = optimizer.zero_optimizer
        layout = self.layout(zopt.model)
        _zero().save_full_optimizer(zopt.model, zopt, directory, max_shard_bytes, layout=layout)

    def capture_model(self, model: Any) -> Writer | None:
        """use_async: whole chunks copied to pinned host memory (zero_capture.py) and
        written later as save_full's files; under a tensor-parallel layout the tensors
        are joined one at a time (collective, as save_full), the writer keeping copies."""
        zero, zmodel = _zero(), model.module
        layout = self.layout(zmodel)
        writer = layout.writes(zmodel.group)
        if writer != is_writer():
            return None  # the files' writer is not the process that publishes them
        if _whole(layout):
            try:
                return zero_capture.capture_params(zmodel, writer)
            except zero_capture.WriteNow:
                return None  # written synchronously (zero_capture: gathered host state)
        plan = [
            (s.name, layout.full_numel(s.name, s.numel) * 4)
            for c in zmodel.chunks
            for s in c.spec.slots
        ]
        tensors = {}
        for name, t in zero.full_state.iter_full_params(zmodel.chunks, zmodel.group):
            full = layout.to_full(name, t).float()  # a collective under a tp layout
            if writer:
                tensors[name] = async_writes.snapshot(full)
        persistent = zmodel.module.state_dict(keep_vars=True).keys()
        buffers = {
            n: async_writes.snapshot(layout.to_full(n, b.detach()))
            for n, b in zmodel.module.named_buffers()
            if n in persistent
        }

        def write(directory: Path, cap: int) -> None:
            out = StreamedFiles(directory, "model", plan, cap, write=writer)
            for name, _ in plan:
                out.add(name, tensors[name])
            if writer and buffers:
                atomic_save(buffers, directory / "buffers.safetensors", metadata={"format": "pt"})
            out.finish({n: "buffers.safetensors" for n in buffers} if writer else {})

        return write

    def capture_optimizer(self, optimizer: Any) -> Writer | None:
        """use_async: every full state gathered now (collective, as save_full_optimizer),
        kept on the writer's host; the files are save_full_optimizer's."""
        zero, zopt = _zero(), optimizer.zero_optimizer
        layout = self.layout(zopt.model)
        writer = layout.writes(zopt.model.group)
        if writer != is_writer():
            return None
        done = None
        try:
            with zero.offload.resident_states(zopt):
                zopt.reducer.wait()
                plan, params = zero.full_optimizer.full_plan(zopt, layout)
                if _whole(layout):
                    states, done = zero_capture.capture_states(zopt, writer)
                else:  # full_states yields fresh host tensors: nothing training touches later
                    states = [(k, t) for k, t in zero.full_optimizer.full_states(zopt, layout)]
                states = states if writer else []
            files = OptimizerFiles(
                plan=plan,
                params=copy.deepcopy(params),
                tensors=iter(states),
                kind=zopt.rule.kind,
                groups=copy.deepcopy(hyperparameters(zopt.optimizer.param_groups)),
                loss_scale=copy.deepcopy(zopt.scaler.state_dict()) if zopt.scaler else None,
                grad_scaler=None,
            )
        except zero_capture.WriteNow:
            return None  # written synchronously (zero_capture: gathered host state)
        except BaseException:
            if done is not None:  # no write will read the states: the next save may pin
                done()
            raise

        def write(directory: Path, cap: int) -> None:
            try:
                write_optimizer_files(files, directory, cap)
            finally:
                if done is not None:
                    done()

        write.release = done  # type: ignore[attr-defined]
        return write

    def read_optimizer(self, optimizer: Any, directory: Path) -> None:
        """With the loss scale: megalith_zero's load_full_optimizer reads it."""
        zopt = optimizer.zero_optimizer
        _zero().load_full_optimizer(zopt.model, zopt, directory, layout=self.layout(zopt.model))


class LowLevelZeroCheckpointIO(ZeroCheckpointIO):
    """ColossalAI's name for LowLevelZeroPlugin's I/O (whole tensors unless given a layout)."""


class GeminiCheckpointIO(ZeroCheckpointIO):
    """ColossalAI's name for GeminiPlugin's I/O; under tp_size > 1 the plugin passes
    tp_layout, so the files hold the tp = 1 run's whole tensors."""
