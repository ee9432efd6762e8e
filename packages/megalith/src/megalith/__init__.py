"""megalith: distributed training for PyTorch on a C++/CUDA engine.

This is the roof dist (the Booster and its plugins, tensor-parallel layers,
reference models, checkpoint I/O, the `megalith` command). The engine and the fused
optimizers live in the floor dist, megalith-core; `megalith._engine` and
`megalith.optim` are those very modules under their old names.

`import megalith` is cheap: it loads neither the engine module nor torch. Both are
imported by the functions and submodules that need them.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

__all__ = [
    "__version__",
    "build_info",
    "get_cmake_dir",
    "get_default_parser",
    "get_include",
    "launch",
    "launch_from_openmpi",
    "launch_from_slurm",
    "launch_from_torch",
]

# Submodules reachable as attributes (megalith.optim) without importing them in
# `import megalith`.
_LAZY_SUBMODULES = (
    "optim",
    "booster",
    "models",
    "accelerator",
    "cluster",
    "interface",
    "logging",
    "utils",
    "nn",
    "lazy",
    "checkpoint_io",
)
# ColossalAI's entry points (colossalai.launch, ...), from megalith.initialize on first use.
_ENTRY_POINTS = (
    "launch",
    "launch_from_torch",
    "launch_from_slurm",
    "launch_from_openmpi",
    "get_default_parser",
)


def build_info() -> dict[str, str]:
    """What this build of the engine contains and what it found on this machine
    (megalith_core.build_info; `megalith env` prints it)."""
    import megalith_core

    return megalith_core.build_info()


def get_cmake_dir() -> str:
    """The directory holding megalithConfig.cmake, for find_package(megalith)
    (megalith_core.get_cmake_dir; the shell form is `python -m megalith --cmake-dir`)."""
    import megalith_core

    return megalith_core.get_cmake_dir()


def get_include() -> str:
    """The directory to put on the include path for `#include "megalith/megalith.h"`."""
    import megalith_core

    return megalith_core.get_include()


def __getattr__(name: str) -> Any:
    if name in _ENTRY_POINTS:
        from . import initialize

        value = getattr(initialize, name)
        globals()[name] = value
        return value
    if name in _LAZY_SUBMODULES:
        module = importlib.import_module(f"{__name__}.{name}")
        globals()[name] = module
        return module
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY_SUBMODULES, *_ENTRY_POINTS})
