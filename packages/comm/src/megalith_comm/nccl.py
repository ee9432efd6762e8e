"""Loading the engine's NCCL communicator, and creating one for a group.

NCCL is loaded by the engine at run time (dlopen of libnccl.so.2). When the
nvidia-nccl-cu13 wheel is installed, its library directory is handed to the
engine first, so the wheel's NCCL is found without LD_LIBRARY_PATH.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

from .errors import CommError

_REQUIRED = ("nccl_available", "nccl_unique_id", "NcclCommunicator")
_search_path_set = False


def nccl_wheel_lib_dir() -> str | None:
    """The lib directory of the nvidia-nccl-cu13 wheel (nvidia/nccl/lib or nvidia/cu13/lib)."""
    try:
        spec = importlib.util.find_spec("nvidia")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    candidates = [
        Path(base) / sub
        for base in spec.submodule_search_locations
        for sub in ("nccl/lib", "cu13/lib")
    ]
    for lib in candidates:
        if (lib / "libnccl.so.2").exists():
            return str(lib)
    return next((str(lib) for lib in candidates if lib.is_dir()), None)


def engine() -> Any:
    """megalith_core._engine with its NCCL functions, NCCL loadable; a CommError naming the fix if not."""
    global _search_path_set
    try:
        from megalith_core import _engine
    except ImportError as exc:
        raise CommError(f"megalith's engine module could not be imported: {exc}") from exc
    missing = [name for name in _REQUIRED if not hasattr(_engine, name)]
    if missing:
        raise CommError(
            "CUDA tensors need the engine's NCCL communicator, but this build of "
            f"megalith_core._engine has no {', '.join(missing)}: install a megalith built with "
            "CUDA (MEGALITH_CUDA=ON) and NCCL's header, or keep tensors on the CPU (Gloo)"
        )
    if not _search_path_set:
        lib = nccl_wheel_lib_dir()
        if lib is not None and hasattr(_engine, "set_nccl_search_path"):
            _engine.set_nccl_search_path(lib)
        _search_path_set = True
    if not _engine.nccl_available():
        try:
            _engine.nccl_version()  # raises saying where it looked
            detail = ""
        except Exception as exc:
            detail = f" ({exc})"
        raise CommError(
            "NCCL could not be loaded (libnccl.so.2), so CUDA tensors cannot be communicated"
            f"{detail}: pip install nvidia-nccl-cu13, or put libnccl.so.2 on LD_LIBRARY_PATH"
        )
    return _engine


def create_communicator(group: Any, device: Any) -> Any:
    """An NcclCommunicator for `group` on `device`; collective over the group's ranks.

    The group's rank 0 makes the unique id and publishes it in the rendezvous store
    under a key unique to the group; the others read it (waiting up to the timeout).
    """
    eng = engine()
    world = group.world
    key = f"megalith_comm/nccl/{group.name}/unique_id"
    if group.rank == 0:
        unique_id = bytes(eng.nccl_unique_id())
        world.store.set(key, unique_id)
    else:
        try:
            unique_id = bytes(world.store.get(key))
        except RuntimeError as exc:
            raise CommError(
                f"group {group.name!r}: rank {world.rank} did not get the NCCL unique id from "
                f"rank {group.ranks[0]} within {world.timeout:g} s; did every rank of the group "
                "make the same first CUDA collective on it?",
                ranks=(group.ranks[0],),
                remote=True,
            ) from exc
    index = device.index if device.index is not None else 0
    return eng.NcclCommunicator(unique_id, group.size, group.rank, index, world.timeout, group.name)
