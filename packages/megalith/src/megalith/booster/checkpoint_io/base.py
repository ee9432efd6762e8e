"""CheckpointIO: ColossalAI's checkpoint methods, with its signatures, over four hooks a
plugin's I/O fills in.

Every plugin writes the same layout-free files (safetensors keyed by parameter
name, megalith_core.optimizer_files for optimizer states, JSON for the scheduler),
so a checkpoint written under one plugin, world size or parallel layout loads
under any other. What differs between plugins is only how the full tensors are
gathered and how each rank takes its part back: `write_model`, `read_model`,
`write_optimizer` and `read_optimizer` (and, for use_async, `capture_model` and
`capture_optimizer`: the gather now, the writing later). The rest is here: sharded
and unsharded saves, ColossalAI's file-name prefix and the paths a load accepts
(locations.py), config.json (hf_config.py), asynchronous writes (async_writes.py),
the scheduler, and the barriers. Every file goes through megalith_core.atomic_files.

Without a process group (GeneralCheckpointIO used on its own, as ColossalAI's tests
do) the process is the writer and the barriers are no-ops.
"""

from __future__ import annotations

import json
import shutil
import warnings
from abc import ABC, abstractmethod
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from megalith_core.atomic_files import atomic_write_text

from . import async_writes
from .hf_config import config_writer
from .locations import model_view, optimizer_view, publish
from .safetensors_join import OPTIMIZER_META, join

#: One file however large: the size cap of an unsharded save.
UNCAPPED = 1 << 62

#: A writer of a checkpoint's files into a directory, given the size cap of one file.
Writer = Callable[[Path, int], None]

_warned: set[str] = set()


def warn_once(key: str, message: str) -> None:
    if key not in _warned:
        _warned.add(key)
        warnings.warn(message, stacklevel=3)


def _comm() -> Any:
    import megalith_comm as comm

    return comm if comm.is_initialized() else None


def is_writer() -> bool:
    """World rank 0 writes the shared files (a process without a group is its own rank 0)."""
    comm = _comm()
    return comm is None or comm.get_world().rank == 0


def barrier() -> None:
    comm = _comm()
    if comm is not None:
        comm.barrier()


def agree(error: BaseException | None) -> None:
    """Collective (a barrier as well): raises on every rank when any rank's error is set,
    naming the rank and its error (rank 0 writes the files, the others only wait)."""
    comm = _comm()
    if comm is None:
        if error is not None:
            raise error
        return
    import torch.distributed as dist

    errors: list[Any] = [None] * comm.get_world().world_size
    dist.all_gather_object(errors, None if error is None else f"{type(error).__name__}: {error}")
    if error is not None:
        raise error
    rank, text = next(((r, e) for r, e in enumerate(errors) if e), (None, None))
    if text is not None:
        raise RuntimeError(f"the checkpoint save failed on rank {rank}: {text}")


def shard_bytes(size_per_shard: float) -> int:
    """ColossalAI's size_per_shard (MiB, an int or a float) in bytes."""
    if size_per_shard <= 0:
        raise ValueError(f"size_per_shard={size_per_shard}: the cap of one file in MiB, > 0")
    return max(1, int(size_per_shard * (1 << 20)))


def _check_args(gather_dtensor: bool = True, low_cpu_mem_mode: bool = True, num_threads: int = 1):
    if not gather_dtensor:
        warn_once(
            "gather_dtensor",
            "gather_dtensor=False is ignored: megalith always writes full (gathered) tensors, "
            "so a checkpoint loads under any layout",
        )
    if not low_cpu_mem_mode:
        warn_once(
            "low_cpu_mem_mode",
            "low_cpu_mem_mode=False is ignored (performance only): megalith reads checkpoint "
            "files memory-mapped, one tensor at a time",
        )
    if num_threads != 1:
        warn_once(
            "num_threads",
            f"num_threads={num_threads} is ignored (performance only): megalith reads each "
            "rank's tensors on one thread",
        )


def _staging(path: Path) -> Path:
    """Where the writer puts files before they take their final names (beside them)."""
    return path.parent / f".{path.name}.megalith-staging"


class CheckpointIO(ABC):
    """A plugin's checkpoint I/O (plugin.get_checkpoint_io()). Every method is collective:
    all ranks call it with their boosted model / optimizer."""

    # -- asynchronous writes ---------------------------------------------------
    def synchronize(self) -> None:
        """Waits for this process's use_async writes (and raises the first one's error)."""
        async_writes.wait()

    def _sync_io(self) -> None:
        """ColossalAI's name for waiting on the asynchronous writes."""
        async_writes.wait()

    def _sync_d2h(self) -> None:
        """ColossalAI's wait for the host copies: a save makes them before it returns, so
        this only raises what a finished background write met."""
        if async_writes.pending() == 0:
            async_writes.wait()

    # -- ColossalAI's methods --------------------------------------------------
    def save_model(
        self,
        model: Any,
        checkpoint: str,
        shard: bool = False,
        gather_dtensor: bool = True,
        prefix: str | None = None,
        size_per_shard: int = 1024,
        use_safetensors: bool = False,
        use_async: bool = False,
    ) -> None:
        """safetensors always (nothing is pickled; use_safetensors=False gives the same
        files): one file, or with shard=True a directory of files of at most
        size_per_shard MiB plus model.safetensors.index.json (and config.json)."""
        if shard:
            self.save_sharded_model(
                model,
                checkpoint,
                gather_dtensor,
                prefix,
                size_per_shard,
                use_safetensors,
                use_async,
            )
        else:
            self.save_unsharded_model(model, checkpoint, gather_dtensor, use_safetensors, use_async)

    def load_model(
        self,
        model: Any,
        checkpoint: str,
        strict: bool = True,
        low_cpu_mem_mode: bool = True,
        num_threads: int = 1,
    ) -> Any:
        """From a .safetensors file, an index file, or a directory (its one index or file)."""
        path = Path(checkpoint)
        if path.is_file() and not path.name.endswith(".index.json"):
            self.load_unsharded_model(model, checkpoint, strict, low_cpu_mem_mode, num_threads)
        else:
            self.load_sharded_model(model, checkpoint, strict, low_cpu_mem_mode, num_threads)
        return model

    def save_optimizer(
        self,
        optimizer: Any,
        checkpoint: str,
        shard: bool = False,
        gather_dtensor: bool = True,
        prefix: str | None = None,
        size_per_shard: int = 1024,
        use_async: bool = False,
    ) -> None:
        """One file (the states, with optimizer.json in its metadata), or with shard=True a
        directory: optimizer.json plus the states' safetensors files and their index."""
        if shard:
            self.save_sharded_optimizer(
                optimizer, checkpoint, gather_dtensor, prefix, size_per_shard, use_async
            )
        else:
            self.save_unsharded_optimizer(optimizer, checkpoint, gather_dtensor, use_async)

    def load_optimizer(
        self,
        optimizer: Any,
        checkpoint: str,
        prefix: str | None = None,
        low_cpu_mem_mode: bool = True,
        num_threads: int = 1,
    ) -> None:
        path = Path(checkpoint)
        if path.is_file() and not path.name.endswith(".index.json"):
            self.load_unsharded_optimizer(optimizer, checkpoint, low_cpu_mem_mode, num_threads)
        else:
            self.load_sharded_optimizer(
                optimizer, checkpoint, prefix, low_cpu_mem_mode, num_threads
            )

    def save_lr_scheduler(self, lr_scheduler: Any, checkpoint: str) -> None:
        """Its state_dict as JSON (megalith does not pickle checkpoints), written by rank 0
        (behind the asynchronous writes still queued: the scheduler is tiny)."""
        if is_writer():
            try:
                text = json.dumps(lr_scheduler.state_dict())
            except TypeError as e:
                raise TypeError(
                    f"{type(lr_scheduler).__name__}'s state_dict is not JSON-serialisable ({e}); "
                    "megalith does not pickle checkpoints"
                ) from None
            path = Path(checkpoint)

            def write() -> None:
                path.parent.mkdir(parents=True, exist_ok=True)
                atomic_write_text(path, text)

            async_writes.after_pending(write)
        barrier()

    def load_lr_scheduler(self, lr_scheduler: Any, checkpoint: str) -> None:
        self._before_load()
        lr_scheduler.load_state_dict(json.loads(Path(checkpoint).read_text()))

    def save_lora_as_pretrained(
        self,
        model: Any,
        checkpoint: str,
        use_safetensors: bool = False,
        state_dict: dict[str, torch.Tensor] | None = None,
    ) -> None:
        """The peft adapter (adapter_model.safetensors + adapter_config.json) as peft's
        save_pretrained writes it, from the full adapter weights; rank 0 writes."""
        from .lora import save_lora_as_pretrained

        async_writes.wait()
        save_lora_as_pretrained(self, model, Path(checkpoint), state_dict)
        barrier()

    # -- the ways of saving and loading, in ColossalAI's names ------------------
    def save_sharded_model(
        self,
        model: Any,
        checkpoint: str,
        gather_dtensor: bool = True,
        prefix: str | None = None,
        size_per_shard: int = 1024,
        use_safetensors: bool = False,
        use_async: bool = False,
    ) -> None:
        _check_args(gather_dtensor)
        directory = Path(checkpoint)
        if directory.is_file():
            raise ValueError(
                f"{directory} is a file; a sharded save writes a directory: pass a directory "
                "path, or shard=False for one file"
            )
        config = config_writer(self.whole_module(model)) if is_writer() else None
        out = _staging(directory / "model") if prefix else directory

        def finish() -> None:
            if config is not None:
                config(out)
            if prefix:
                publish(out, directory, prefix)
                shutil.rmtree(out, ignore_errors=True)

        write, deferred = self._model_writer(model, use_async)
        self._commit(write, out, shard_bytes(size_per_shard), finish, deferred)

    def save_unsharded_model(
        self,
        model: Any,
        checkpoint: str,
        gather_dtensor: bool = True,
        use_safetensors: bool = False,
        use_async: bool = False,
    ) -> None:
        """The files of a sharded save without a cap (parameters, and under ZeRO its
        buffers.safetensors), joined into the one file at checkpoint."""
        _check_args(gather_dtensor)
        path = Path(checkpoint)
        staging = _staging(path)

        def finish() -> None:
            join(_tensor_files(staging, "model"), path, {"format": "pt"})
            shutil.rmtree(staging, ignore_errors=True)

        write, deferred = self._model_writer(model, use_async)
        self._commit(write, staging, UNCAPPED, finish, deferred)

    def load_sharded_model(
        self,
        model: Any,
        checkpoint_index_file: str,
        strict: bool = True,
        low_cpu_mem_mode: bool = True,
        num_threads: int = 1,
    ) -> None:
        """From a directory or an index file in one (any prefix)."""
        self._load_model_at(model, checkpoint_index_file, strict, low_cpu_mem_mode, num_threads)

    def load_unsharded_model(
        self,
        model: Any,
        checkpoint: str,
        strict: bool = True,
        low_cpu_mem_mode: bool = True,
        num_threads: int = 1,
    ) -> None:
        self._load_model_at(model, checkpoint, strict, low_cpu_mem_mode, num_threads)

    def _load_model_at(
        self, model: Any, path: str, strict: bool, low_cpu_mem_mode: bool, num_threads: int
    ) -> None:
        """Either layout: model_view presents a file, an index or a directory as one."""
        _check_args(low_cpu_mem_mode=low_cpu_mem_mode, num_threads=num_threads)
        self._before_load()
        with model_view(path) as directory:
            self.read_model(model, directory, strict)

    def save_sharded_optimizer(
        self,
        optimizer: Any,
        checkpoint: str,
        gather_dtensor: bool = True,
        prefix: str | None = None,
        size_per_shard: int = 1024,
        use_async: bool = False,
    ) -> None:
        _check_args(gather_dtensor)
        directory = Path(checkpoint)
        if directory.is_file():
            raise ValueError(
                f"{directory} is a file; a sharded save writes a directory: pass a directory "
                "path, or shard=False for one file"
            )
        out = _staging(directory / "optimizer") if prefix else directory

        def finish() -> None:
            if prefix:
                publish(out, directory, prefix)
                shutil.rmtree(out, ignore_errors=True)

        write, deferred = self._optimizer_writer(optimizer, use_async)
        self._commit(write, out, shard_bytes(size_per_shard), finish, deferred)

    def save_unsharded_optimizer(
        self,
        optimizer: Any,
        checkpoint: str,
        gather_dtensor: bool = True,
        use_async: bool = False,
    ) -> None:
        """One safetensors file holding every state, optimizer.json in its metadata. (A path
        that is an existing directory gets a sharded save's files, uncapped.)"""
        _check_args(gather_dtensor)
        path = Path(checkpoint)
        write, deferred = self._optimizer_writer(optimizer, use_async)
        if path.is_dir():
            self._commit(write, path, UNCAPPED, None, deferred)
            return
        staging = _staging(path)

        def finish() -> None:
            meta = (staging / "optimizer.json").read_text()
            join(_tensor_files(staging, "optimizer"), path, {OPTIMIZER_META: meta})
            shutil.rmtree(staging, ignore_errors=True)

        self._commit(write, staging, UNCAPPED, finish, deferred)

    def load_sharded_optimizer(
        self,
        optimizer: Any,
        index_file_path: str,
        prefix: str | None = None,
        low_cpu_mem_mode: bool = True,
        num_threads: int = 1,
    ) -> None:
        """From a directory (its one optimizer.json, or optimizer.<prefix>.json) or an
        index file in one."""
        _check_args(low_cpu_mem_mode=low_cpu_mem_mode, num_threads=num_threads)
        self._before_load()
        with optimizer_view(index_file_path, prefix) as directory:
            self.read_optimizer(optimizer, directory)
        barrier()

    def load_unsharded_optimizer(
        self,
        optimizer: Any,
        checkpoint: str,
        low_cpu_mem_mode: bool = True,
        num_threads: int = 1,
    ) -> None:
        _check_args(low_cpu_mem_mode=low_cpu_mem_mode, num_threads=num_threads)
        self._before_load()
        with optimizer_view(checkpoint) as directory:
            self.read_optimizer(optimizer, directory)
        barrier()

    # -- how a save runs ------------------------------------------------------
    def _before_load(self) -> None:
        """Every rank's asynchronous writes are on disk before any rank reads."""
        async_writes.wait()
        barrier()

    def _model_writer(self, model: Any, use_async: bool) -> tuple[Writer, bool]:
        """(what writes the files, whether it may run later on the writer thread). A
        capture waits only for the earlier write that reads its pinned region (the model
        just queued may still be written while the optimizer is captured)."""
        if use_async:
            captured = _captured(self.capture_model, model)
            if captured is not None:
                return captured, True
            self._warn_sync()
        async_writes.wait()
        return (lambda directory, cap: self.write_model(model, directory, cap)), False

    def _optimizer_writer(self, optimizer: Any, use_async: bool) -> tuple[Writer, bool]:
        """(what writes the files, whether it may run later on the writer thread). A
        capture waits only for the earlier write that reads its pinned region (the model
        just queued may still be written while the optimizer is captured)."""
        if use_async:
            captured = _captured(self.capture_optimizer, optimizer)
            if captured is not None:
                return captured, True
            self._warn_sync()
        async_writes.wait()
        return (lambda directory, cap: self.write_optimizer(optimizer, directory, cap)), False

    def _warn_sync(self) -> None:
        warn_once(
            f"use_async:{type(self).__name__}",
            f"use_async=True: {type(self).__name__} writes synchronously (its tensors are "
            "gathered while they are written); the files are the same",
        )

    def _commit(
        self,
        write: Writer,
        out: Path,
        cap: int,
        finish: Callable[[], None] | None,
        deferred: bool,
    ) -> None:
        """write(out, cap) (collective unless it was captured), then finish() on the
        writer; with deferred (a captured writer) both run on the writer thread."""
        writer = is_writer()
        if writer:
            if out.name.endswith(".megalith-staging"):  # what a crashed save left
                shutil.rmtree(out, ignore_errors=True)
            out.mkdir(parents=True, exist_ok=True)

        def run() -> None:
            write(out, cap)
            if writer and finish is not None:
                finish()

        if deferred:
            if writer:
                async_writes.submit(run, getattr(write, "release", None))
            barrier()
            return
        error = None
        try:
            run()
        except Exception as e:  # every rank raises it below, rather than one rank alone
            error = e
        agree(error)

    # -- what a plugin's I/O provides -----------------------------------------
    def whole_module(self, model: Any) -> torch.nn.Module:
        """The model as given to boost() (or a plain module): the files' keys are its names."""
        return model.unwrap() if hasattr(model, "unwrap") else model

    def capture_model(self, model: Any) -> Writer | None:
        """For use_async: the model's full tensors copied to host now (collective), and what
        writes them later; None: this I/O writes synchronously."""
        return None

    def capture_optimizer(self, optimizer: Any) -> Writer | None:
        """As capture_model, for the optimizer's states."""
        return None

    @abstractmethod
    def write_model(self, model: Any, directory: Path, max_shard_bytes: int) -> None:
        """The model's full tensors (parameters and persistent buffers) as safetensors files
        of at most max_shard_bytes plus model.safetensors.index.json under directory."""

    @abstractmethod
    def read_model(self, model: Any, directory: Path, strict: bool) -> None:
        """Each rank takes its part of the tensors in directory's files."""

    @abstractmethod
    def write_optimizer(self, optimizer: Any, directory: Path, max_shard_bytes: int) -> None:
        """The full optimizer states in megalith_core.optimizer_files' form."""

    @abstractmethod
    def read_optimizer(self, optimizer: Any, directory: Path) -> None:
        """Each rank takes its part of every state in directory's files."""


def _captured(capture: Callable[[Any], Writer | None], obj: Any) -> Writer | None:
    """capture(obj) (collective); when it fails on a rank, the writes already queued
    (this save's model, say) finish before the error leaves, so the caller may remove
    their directory, and every rank raises."""
    captured, error = None, None
    try:
        captured = capture(obj)
    except Exception as e:
        error = async_writes.abandon(e)
        error.__cause__ = e
    try:
        agree(error)
    except BaseException:
        release = getattr(captured, "release", None)
        if release is not None:  # another rank failed: this capture is never written
            release()
        raise
    return captured


def _tensor_files(directory: Path, stem: str) -> list[Path]:
    """The safetensors files a writer put in directory: those its index names, in order."""
    index = directory / f"{stem}.safetensors.index.json"
    if index.is_file():
        names = dict.fromkeys(json.loads(index.read_text())["weight_map"].values())
        return [directory / n for n in names if (directory / n).is_file()]
    single = directory / f"{stem}.safetensors"
    return [single] if single.is_file() else []
