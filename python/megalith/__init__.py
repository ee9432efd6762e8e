"""megalith: distributed training for PyTorch on a C++/CUDA engine.

`import megalith` is cheap: it loads neither the engine module (megalith._engine)
nor torch. Both are imported by the functions and submodules that need them.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from types import ModuleType

__version__ = "0.1.0"

__all__ = ["__version__", "build_info", "get_cmake_dir", "get_include", "launch_from_torch"]

_HERE = Path(__file__).resolve().parent

# Submodules reachable as attributes (megalith.optim) without importing them in
# `import megalith`.
_LAZY_SUBMODULES = ("optim", "booster", "models")


def _load_engine() -> ModuleType:
    """Imports megalith._engine, turning a failure into an error that names the fix."""
    try:
        return importlib.import_module("megalith._engine")
    except ImportError as exc:
        raise ImportError(
            f"megalith's engine module (megalith._engine) could not be loaded from {_HERE}: "
            f"{exc}. It is compiled when megalith is installed: reinstall with "
            "`pip install megalith` (or `pip install .` in a source checkout)."
        ) from exc


def build_info() -> dict[str, str]:
    """What this build of the engine contains and what it found on this machine.

    Keys include version, cxx_compiler, cxx_flags, build_type,
    simd_levels_compiled, simd_level_best, simd_level_active, cuda_compiled,
    cuda_archs, cuda_status and threads. `megalith env` prints them.
    """
    return dict(_load_engine().build_info())


def _installed_dir(relative: str, marker: str, what: str) -> str:
    path = _HERE / relative
    if not (path / marker).is_file():
        raise FileNotFoundError(
            f"megalith's {what} are not at {path} (no {marker}): this megalith is not an "
            "installed build. Install it with `pip install megalith` "
            "(or `pip install .` in a source checkout)."
        )
    return str(path)


def get_cmake_dir() -> str:
    """The directory holding megalithConfig.cmake, for find_package(megalith).

    Pass it as CMAKE_PREFIX_PATH or megalith_DIR; the shell form is
    `python -m megalith --cmake-dir`.
    """
    return _installed_dir("lib/cmake/megalith", "megalithConfig.cmake", "CMake files")


def get_include() -> str:
    """The directory to put on the include path for `#include "megalith/megalith.h"`."""
    return _installed_dir("include", "megalith/megalith.h", "C++ headers")


def __getattr__(name: str) -> Any:
    if name == "launch_from_torch":  # colossalai.launch_from_torch's place
        from .booster import launch_from_torch

        return launch_from_torch
    if name in _LAZY_SUBMODULES:
        module = importlib.import_module(f"{__name__}.{name}")
        globals()[name] = module
        return module
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_LAZY_SUBMODULES])
