"""One module reachable under two names, without a second copy of it.

The `megalith` dist keeps the names users import (`megalith._engine`,
`megalith.optim`) for modules that live in this floor dist. Re-exporting with
`from ... import *` would make a second module object (and, for a package, second
copies of its submodules and their classes, so isinstance checks and optimizer
state would split in two); registering the very same objects in sys.modules under
the other name does not.
"""

from __future__ import annotations

import importlib
import pkgutil
import sys
from types import ModuleType


def alias_module(name: str, target: str) -> ModuleType:
    """Makes `name` (and, for a package, each `name.<sub>`) the module `target` itself."""
    module = importlib.import_module(target)
    sys.modules[name] = module
    for info in pkgutil.iter_modules(getattr(module, "__path__", [])):
        sub = importlib.import_module(f"{target}.{info.name}")
        sys.modules[f"{name}.{info.name}"] = sub
    return module
