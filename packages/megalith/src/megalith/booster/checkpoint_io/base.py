"""CheckpointIO: ColossalAI's checkpoint methods over four hooks a plugin's I/O fills in.

Every plugin writes the same layout-free files (safetensors keyed by parameter
name, megalith_core.optimizer_files for optimizer states, JSON for the scheduler),
so a checkpoint written under one plugin, world size or parallel layout loads
under any other. What differs between plugins is only how the full tensors are
gathered and how each rank takes its part back: `write_model`, `read_model`,
`write_optimizer` and `read_optimizer`. The rest is here: sharded and unsharded
saves, single-file model loads, config.json, the scheduler, and the barriers.
Every file goes through megalith_core.atomic_files.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any

import torch

from megalith_core.atomic_files import atomic_rename, atomic_write_text
from megalith_core.safetensors_files import atomic_json

from ..plugin.base import world

#: One file however large: the size cap of an unsharded save.
UNCAPPED = 1 << 62


def is_writer() -> bool:
    """World rank 0 writes the shared files."""
    return world().rank == 0


def barrier() -> None:
    import megalith_comm as comm

    comm.barrier()


class CheckpointIO(ABC):
    """A plugin's checkpoint I/O (plugin.get_checkpoint_io()). Every method is
    collective: all ranks call it with their boosted model / optimizer."""

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
    ) -> None:
        """safetensors always (nothing is pickled): one file, or with shard=True a
        directory of files of at most size_per_shard MiB plus model.safetensors.index.json."""
        if shard:
            self.save_sharded_model(
                model, checkpoint, gather_dtensor, prefix, size_per_shard, use_safetensors
            )
        else:
            self.save_unsharded_model(model, checkpoint, gather_dtensor, use_safetensors)

    def load_model(self, model: Any, checkpoint: str, strict: bool = True) -> Any:
        """From a single .safetensors file or a directory (with an index or one file)."""
        if Path(checkpoint).is_file():
            self.load_unsharded_model(model, checkpoint, strict)
        else:
            self.load_sharded_model(model, checkpoint, strict)
        return model

    def save_optimizer(
        self,
        optimizer: Any,
        checkpoint: str,
        shard: bool = False,
        gather_dtensor: bool = True,
        prefix: str | None = None,
        size_per_shard: int = 1024,
    ) -> None:
        """A directory: optimizer.json plus the states' safetensors files."""
        if shard:
            self.save_sharded_optimizer(
                optimizer, checkpoint, gather_dtensor, prefix, size_per_shard
            )
        else:
            self.save_unsharded_optimizer(optimizer, checkpoint, gather_dtensor)

    def load_optimizer(
        self, optimizer: Any, checkpoint: str, prefix: str | None = None, size_per_shard: int = 1024
    ) -> None:
        self.read_optimizer(optimizer, Path(checkpoint))
        barrier()

    def save_lr_scheduler(self, lr_scheduler: Any, checkpoint: str) -> None:
        """Its state_dict as JSON (megalith does not pickle checkpoints), written by rank 0."""
        if is_writer():
            try:
                text = json.dumps(lr_scheduler.state_dict())
            except TypeError as e:
                raise TypeError(
                    f"{type(lr_scheduler).__name__}'s state_dict is not JSON-serialisable ({e}); "
                    "megalith does not pickle checkpoints"
                ) from None
            path = Path(checkpoint)
            path.parent.mkdir(parents=True, exist_ok=True)
            atomic_write_text(path, text)
        barrier()

    def load_lr_scheduler(self, lr_scheduler: Any, checkpoint: str) -> None:
        lr_scheduler.load_state_dict(json.loads(Path(checkpoint).read_text()))

    # -- the ways of saving and loading, in ColossalAI's names ------------------
    def save_sharded_model(
        self,
        model: Any,
        checkpoint: str,
        gather_dtensor: bool = True,
        prefix: str | None = None,
        size_per_shard: int = 1024,
        use_safetensors: bool = False,
    ) -> None:
        directory = Path(checkpoint)
        self.write_model(model, directory, size_per_shard << 20)
        whole = self.whole_module(model)
        if is_writer() and hasattr(whole, "to_hf_config"):  # transformers' from_pretrained reads it
            atomic_json(whole.to_hf_config(), directory / "config.json")
        barrier()

    def save_unsharded_model(
        self,
        model: Any,
        checkpoint: str,
        gather_dtensor: bool = True,
        use_safetensors: bool = False,
    ) -> None:
        """The files of a sharded save without a cap, in a staging directory beside the
        target, whose one model.safetensors is then renamed onto it."""
        path = Path(checkpoint)
        staging = Path(tempfile.mkdtemp(prefix=".save-", dir=path.parent))
        try:
            self.write_model(model, staging, UNCAPPED)
            barrier()
            if is_writer():
                atomic_rename(staging / "model.safetensors", path)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        barrier()

    def load_sharded_model(self, model: Any, checkpoint: str, strict: bool = True) -> None:
        self.read_model(model, Path(checkpoint), strict)

    def load_unsharded_model(self, model: Any, checkpoint: str, strict: bool = True) -> None:
        """Reads a single file through a one-file directory view of it."""
        view = Path(tempfile.mkdtemp(prefix=".load-"))
        try:
            os.symlink(Path(checkpoint).resolve(), view / "model.safetensors")
            self.read_model(model, view, strict)
        finally:
            shutil.rmtree(view, ignore_errors=True)

    def save_sharded_optimizer(
        self,
        optimizer: Any,
        checkpoint: str,
        gather_dtensor: bool = True,
        prefix: str | None = None,
        size_per_shard: int = 1024,
    ) -> None:
        self.write_optimizer(optimizer, Path(checkpoint), size_per_shard << 20)
        barrier()

    def save_unsharded_optimizer(
        self, optimizer: Any, checkpoint: str, gather_dtensor: bool = True
    ) -> None:
        """The same directory as a sharded save, with every state in one file."""
        self.write_optimizer(optimizer, Path(checkpoint), UNCAPPED)
        barrier()

    # -- what a plugin's I/O provides -----------------------------------------
    def whole_module(self, model: Any) -> torch.nn.Module:
        """The model as given to boost(): its parameter names are the files' keys."""
        return model.unwrap()

    @abstractmethod
    def write_model(self, model: Any, directory: Path, max_shard_bytes: int) -> None:
        """The model's full tensors as safetensors files of at most max_shard_bytes plus
        model.safetensors.index.json under directory."""

    @abstractmethod
    def read_model(self, model: Any, directory: Path, strict: bool) -> None:
        """Each rank takes its part of the tensors in directory's files."""

    @abstractmethod
    def write_optimizer(self, optimizer: Any, directory: Path, max_shard_bytes: int) -> None:
        """The full optimizer states in megalith_core.optimizer_files' form."""

    @abstractmethod
    def read_optimizer(self, optimizer: Any, directory: Path) -> None:
        """Each rank takes its part of every state in directory's files."""
