"""The layering rules of DESIGN.md, checked on the source tree.

1. core/ knows nothing of Python or PyTorch: no source under it includes
   Python.h, nanobind, pybind11, torch, ATen or c10, and its CMake files do not
   look for Python, nanobind or Torch.
2. The sub-packages import only downwards: megalith_comm imports none of
   megalith_zero / megalith_pipeline / megalith_offload; those three do not import
   each other, except megalith_zero -> megalith_offload behind a guard (try/except
   ImportError, or `if TYPE_CHECKING:`) so that megalith_zero works without it.
   From the `megalith` dist they may use only the engine module (megalith._engine)
   and the fused optimizers over it (megalith.optim: DESIGN.md puts HybridAdam & co.
   in the `megalith` dist, and ZeRO and offload step their shards with them); the
   rest of python/megalith (Booster, plugins, CLI) sits above them.
3. megalith.optim itself imports nothing of megalith but the engine, so that
   allowance cannot pull the upper layers in.

Imports are read with ast, so strings and comments that mention a module do not count.
Each checker also runs on small synthetic inputs, so the test means something
while the packages are still empty.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# -- core/: no Python, no PyTorch ---------------------------------------------

CORE_SUFFIXES = {".h", ".hpp", ".c", ".cc", ".cpp", ".cxx", ".cu", ".cuh", ".in", ".inl"}
FORBIDDEN_INCLUDE = re.compile(
    r"^\s*#\s*include\s*[<\"]\s*(Python\.h|nanobind/|pybind11/|torch/|ATen/|c10/)", re.MULTILINE
)
FORBIDDEN_CMAKE = re.compile(
    r"^[^#\n]*\b(find_package\s*\(\s*(Python\d?|nanobind|pybind11|Torch)\b|nanobind_add_module|"
    r"pybind11_add_module|Python\d?::)",
    re.MULTILINE | re.IGNORECASE,
)


def core_violations(core: Path) -> list[str]:
    """'path:line: text' for each forbidden include or CMake reference under core."""
    found = []
    for path in sorted(core.rglob("*")):
        if not path.is_file():
            continue
        if path.suffix in CORE_SUFFIXES:
            pattern = FORBIDDEN_INCLUDE
        elif path.name == "CMakeLists.txt" or path.suffix == ".cmake":
            pattern = FORBIDDEN_CMAKE
        else:
            continue
        text = path.read_text(errors="replace")
        for match in pattern.finditer(text):
            line = text.count("\n", 0, match.start()) + 1
            found.append(f"{path.relative_to(core.parent)}:{line}: {match.group(0).strip()}")
    return found


def test_core_has_no_python_or_torch():
    violations = core_violations(ROOT / "core")
    assert not violations, (
        "core/ must build without Python or PyTorch (DESIGN.md, Layers); these files reach "
        "for them:\n  " + "\n  ".join(violations)
    )


def test_core_checker_catches_violations(tmp_path):
    core = tmp_path / "core"
    (core / "src").mkdir(parents=True)
    (core / "src" / "ok.cpp").write_text(
        '#include <vector>\n#include "megalith/error.h"\n// #include <torch/torch.h> is not real\n'
    )
    (core / "src" / "bad.cpp").write_text('#include <vector>\n#  include "nanobind/nanobind.h"\n')
    (core / "src" / "bad.cuh").write_text("#include <ATen/ATen.h>\n")
    (core / "include").mkdir()
    (core / "include" / "bad.h").write_text("#include <Python.h>\n#include <c10/util/Half.h>\n")
    (core / "CMakeLists.txt").write_text(
        "# no Python here: find_package(Python) is only a comment\nfind_package(Torch REQUIRED)\n"
    )
    assert core_violations(core) == [
        "core/CMakeLists.txt:2: find_package(Torch",
        "core/include/bad.h:1: #include <Python.h",
        "core/include/bad.h:2: #include <c10/",
        'core/src/bad.cpp:2: #  include "nanobind/',
        "core/src/bad.cuh:1: #include <ATen/",
    ]


# -- packages/: imports only go down ------------------------------------------

SUBPACKAGES = ("comm", "zero", "pipeline", "offload")
# What each sub-package must not import (top-level module names).
FORBIDDEN_IMPORTS = {
    "megalith_comm": {"megalith_zero", "megalith_pipeline", "megalith_offload"},
    "megalith_zero": {"megalith_pipeline", "megalith_offload"},
    "megalith_pipeline": {"megalith_zero", "megalith_offload"},
    "megalith_offload": {"megalith_zero", "megalith_pipeline"},
}
# Allowed only behind a guard (optional dependencies).
GUARDED_ALLOWED = {("megalith_zero", "megalith_offload")}
# What the sub-packages may import from the `megalith` dist: the engine and its optimizers.
MEGALITH_ALLOWED = ("megalith._engine", "megalith.optim")


def _is_guard(node: ast.AST) -> bool:
    if isinstance(node, ast.Try):
        for handler in node.handlers:
            types = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
            for t in types:
                name = t.id if isinstance(t, ast.Name) else getattr(t, "attr", None)
                if name in ("ImportError", "ModuleNotFoundError"):
                    return True
    if isinstance(node, ast.If):
        test = node.test
        name = test.id if isinstance(test, ast.Name) else getattr(test, "attr", None)
        return name == "TYPE_CHECKING"
    return False


def imports_of(source: str) -> list[tuple[str, int, bool]]:
    """(absolute module name, line, guarded) for every absolute import in source."""
    tree = ast.parse(source)
    found = []

    def visit(node: ast.AST, guarded: bool) -> None:
        if isinstance(node, ast.Import):
            found.extend((alias.name, node.lineno, guarded) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            # `from pkg import name` may import the submodule pkg.name; for a bare top-level
            # package record pkg.name so `from megalith import _engine` reads as megalith._engine.
            for alias in node.names:
                name = node.module if "." in node.module else f"{node.module}.{alias.name}"
                found.append((name, node.lineno, guarded))
        if isinstance(node, ast.Try):
            # Only the try body is guarded, not the handlers or the else/finally blocks.
            body_guarded = guarded or _is_guard(node)
            for child in node.body:
                visit(child, body_guarded)
            for child in [*node.handlers, *node.orelse, *node.finalbody]:
                visit(child, guarded)
            return
        if isinstance(node, ast.If) and _is_guard(node):
            for child in node.body:
                visit(child, True)
            for child in node.orelse:
                visit(child, guarded)
            return
        for child in ast.iter_child_nodes(node):
            visit(child, guarded)

    visit(tree, False)
    return found


def import_violations(package: str, source: str) -> list[str]:
    """'line: reason' for each import `package` may not make."""
    out = []
    for module, line, guarded in imports_of(source):
        top = module.split(".")[0]
        if top in FORBIDDEN_IMPORTS[package]:
            if (package, top) in GUARDED_ALLOWED and guarded:
                continue
            how = " unguarded" if (package, top) in GUARDED_ALLOWED else ""
            out.append(f"{line}: imports {top}{how}")
        elif top == "megalith" and not any(
            module == allowed or module.startswith(allowed + ".") for allowed in MEGALITH_ALLOWED
        ):
            out.append(f"{line}: imports {module} (below it: only {', '.join(MEGALITH_ALLOWED)})")
    return out


def test_subpackages_import_only_downwards():
    checked = 0
    violations = []
    for name in SUBPACKAGES:
        package = f"megalith_{name}"
        src = ROOT / "packages" / name / "src" / package
        assert (src / "__init__.py").is_file(), f"{src}/__init__.py is missing"
        for path in sorted(src.rglob("*.py")):
            checked += 1
            for v in import_violations(package, path.read_text()):
                violations.append(f"{path.relative_to(ROOT)}:{v}")
    assert checked >= len(SUBPACKAGES)
    assert not violations, (
        "packages may import only what is below them (DESIGN.md, Layers):\n  "
        + "\n  ".join(violations)
    )


def test_optim_imports_only_the_engine():
    violations = []
    for path in sorted((ROOT / "python" / "megalith" / "optim").rglob("*.py")):
        for module, line, _ in imports_of(path.read_text()):
            if module == "megalith" or module.startswith("megalith."):
                if not (
                    module.startswith("megalith._engine") or module.startswith("megalith.optim")
                ):
                    violations.append(f"{path.relative_to(ROOT)}:{line}: imports {module}")
    assert not violations, "megalith.optim sits right above the engine:\n  " + "\n  ".join(
        violations
    )


@pytest.mark.parametrize(
    ("package", "source", "expected"),
    [
        ("megalith_comm", "import torch\nfrom megalith import _engine\n", []),
        ("megalith_comm", "import megalith._engine as e\n", []),
        ("megalith_zero", "from megalith.optim import functional as F\n", []),
        ("megalith_comm", "from megalith_zero import stage3\n", ["1: imports megalith_zero"]),
        (
            "megalith_comm",
            "def f():\n    import megalith_offload\n",
            ["2: imports megalith_offload"],
        ),
        ("megalith_comm", "x = 'import megalith_zero'  # import megalith_zero\n", []),
        ("megalith_pipeline", "import megalith_zero.stage1\n", ["1: imports megalith_zero"]),
        ("megalith_offload", "from megalith_pipeline import x\n", ["1: imports megalith_pipeline"]),
        ("megalith_zero", "import megalith_offload\n", ["1: imports megalith_offload unguarded"]),
        (
            "megalith_zero",
            "try:\n    import megalith_offload\nexcept ImportError:\n    megalith_offload = None\n",
            [],
        ),
        (
            "megalith_zero",
            "try:\n    from megalith_offload import policy\nexcept (ModuleNotFoundError, OSError):\n"
            "    policy = None\n",
            [],
        ),
        (
            "megalith_zero",
            "try:\n    pass\nexcept ImportError:\n    import megalith_offload\n",
            ["4: imports megalith_offload unguarded"],
        ),
        (
            "megalith_zero",
            "try:\n    import megalith_offload\nexcept ValueError:\n    pass\n",
            ["2: imports megalith_offload unguarded"],
        ),
        (
            "megalith_zero",
            "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import megalith_offload\n",
            [],
        ),
        (
            "megalith_zero",
            "from megalith.booster import Booster\n",
            ["1: imports megalith.booster (below it: only megalith._engine, megalith.optim)"],
        ),
        (
            "megalith_zero",
            "import megalith\n",
            ["1: imports megalith (below it: only megalith._engine, megalith.optim)"],
        ),
    ],
)
def test_import_checker(package, source, expected):
    assert import_violations(package, source) == expected
