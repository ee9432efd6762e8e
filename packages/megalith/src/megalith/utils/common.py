"""ColossalAI's small helpers (colossalai.utils.common): seeds, paths, contexts, tensors."""

from __future__ import annotations

import contextlib
import functools
import os
import random
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch


def get_current_device() -> torch.device:
    """The accelerator's current device: cuda:<i> on a GPU rank, cpu on a CPU rank."""
    from megalith.accelerator import get_accelerator

    return get_accelerator().get_current_device()


def set_seed(seed: int) -> None:
    """Seeds python's random, numpy (when installed) and torch (CPU and every GPU)."""
    random.seed(seed)
    try:
        import numpy as np
    except ImportError:
        pass
    else:
        np.random.seed(seed)
    torch.manual_seed(seed)


def ensure_path_exists(filename: str) -> None:
    """Creates the directory that `filename` is in, if it is missing."""
    dirpath = os.path.dirname(filename)
    if dirpath:
        Path(dirpath).mkdir(parents=True, exist_ok=True)


@contextlib.contextmanager
def conditional_context(context_manager: Any, enable: bool = True) -> Iterator[None]:
    """Enters context_manager when enable, else runs the body without it."""
    if enable:
        with context_manager:
            yield
    else:
        yield


def is_ddp_ignored(p: torch.Tensor) -> bool:
    """Whether a parameter is marked to be left out of data-parallel gradient reduction."""
    return getattr(p, "_ddp_to_ignore", False)


def disposable(func: Callable) -> Callable:
    """The function runs on its first call only; later calls do nothing and return None."""
    executed = False

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        nonlocal executed
        if not executed:
            executed = True
            return func(*args, **kwargs)
        return None

    return wrapper


def free_storage(data: torch.Tensor) -> None:
    """Frees the memory under a tensor (its storage resized to 0); the tensor must be the
    only one on that storage, from its start."""
    storage = data.untyped_storage()
    if storage.size() > 0:
        if data.storage_offset() != 0:
            raise ValueError(
                "free_storage: the tensor starts at offset "
                f"{data.storage_offset()} of a storage it shares; free the tensor that owns it"
            )
        storage.resize_(0)


def _cast_float(args: Any, dtype: torch.dtype) -> Any:
    """Floating-point tensors in args (nested lists, tuples, dicts) cast to dtype."""
    if isinstance(args, torch.Tensor) and torch.is_floating_point(args):
        return args.to(dtype)
    if isinstance(args, (list, tuple)):
        return type(args)(_cast_float(t, dtype) for t in args)
    if isinstance(args, dict):
        return {k: _cast_float(v, dtype) for k, v in args.items()}
    return args


def get_non_persistent_buffers_set(
    module: torch.nn.Module,
    memo: set[torch.nn.Module] | None = None,
    prefix: str = "",
    remove_duplicate: bool = True,
) -> set[str]:
    """Qualified names of the buffers registered with persistent=False in module and its
    children (those a state_dict leaves out)."""
    if memo is None:
        memo = set()
    if module in memo:
        return set()
    if remove_duplicate:
        memo.add(module)
    dot = "." if prefix else ""
    names = {prefix + dot + key for key in module._non_persistent_buffers_set}
    for name, child in module._modules.items():
        if child is not None:
            names |= get_non_persistent_buffers_set(
                child, memo, prefix + dot + name, remove_duplicate
            )
    return names
