"""megalith-core: the floor every megalith package stands on.

It holds the compiled engine (`megalith_core._engine`: NCCL collectives, chunk
memory, fused optimizers, async file I/O), the fused optimizers as
torch.optim.Optimizers (`megalith_core.optim`), the torch <-> engine dtype table,
the engine-backed memory arena, loss scaling and the checkpoint file format. It
depends on nothing else of megalith's: megalith-comm, -zero, -pipeline and -offload
build on it, and the `megalith` dist (Booster, CLI) on all of them.

`import megalith_core` is cheap: it loads neither the engine nor torch.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from types import ModuleType

__version__ = "0.1.0"

__all__ = ["__version__", "build_info", "get_cmake_dir", "get_include", "load_engine"]

_HERE = Path(__file__).resolve().parent


def load_engine() -> ModuleType:
    """Imports megalith_core._engine, turning a failure into an error that names the fix."""
    try:
        return importlib.import_module("megalith_core._engine")
    except ImportError as exc:
        raise ImportError(
            f"megalith's engine module (megalith_core._engine) could not be loaded from {_HERE}: "
            f"{exc}. It is compiled when megalith-core is installed: reinstall with "
            "`pip install megalith-core` (or `pip install .` at the root of a source checkout)."
        ) from exc


def build_info() -> dict[str, str]:
    """What this build of the engine contains and what it found on this machine.

    Keys include version, cxx_compiler, cxx_flags, build_type,
    simd_levels_compiled, simd_level_best, simd_level_active, cuda_compiled,
    cuda_archs, cuda_status and threads. `megalith env` prints them.
    """
    return dict(load_engine().build_info())


def _installed_dir(relative: str, marker: str, what: str) -> str:
    path = _HERE / relative
    if not (path / marker).is_file():
        raise FileNotFoundError(
            f"megalith's {what} are not at {path} (no {marker}): this megalith-core is not an "
            "installed build. Install it with `pip install megalith-core` "
            "(or `pip install .` at the root of a source checkout)."
        )
    return str(path)


def get_cmake_dir() -> str:
    """The directory holding megalithConfig.cmake, for find_package(megalith).

    Pass it as CMAKE_PREFIX_PATH or megalith_DIR; the shell form is
    `python -m megalith_core --cmake-dir` (or `python -m megalith --cmake-dir`).
    """
    return _installed_dir("lib/cmake/megalith", "megalithConfig.cmake", "CMake files")


def get_include() -> str:
    """The directory to put on the include path for `#include "megalith/megalith.h"`."""
    return _installed_dir("include", "megalith/megalith.h", "C++ headers")
