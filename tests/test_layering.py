"""The layering rules of docs/DESIGN.md, checked on the source tree and the dists.

1. core/ knows nothing of Python or PyTorch: no source under it includes
   Python.h, nanobind, pybind11, torch, ATen or c10, and its CMake files do not
   look for Python, nanobind or Torch.
2. The floor dist (megalith-core, package megalith_core: the engine, the fused
   optimizers, dtypes, memory arena, loss scaling, checkpoint format) imports
   nothing of megalith's.
3. The sub-packages import only downwards: megalith_comm imports none of
   megalith_zero / megalith_pipeline / megalith_offload; those three do not import
   each other, except megalith_zero -> megalith_offload behind a guard (try/except
   ImportError, or `if TYPE_CHECKING:`) so that megalith_zero works without it.
   Of megalith's own code below them they use megalith_core only, never the roof
   dist `megalith` (Booster, plugins, CLI), and never another package's private
   names (a `_module` or `_name` of megalith_core or of another package).
4. No import cycle runs across packages.
5. The dists say the same: no package dist depends on the roof dist, the floor on
   no dist of megalith's.

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
FLOOR = "megalith_core"
ROOF = "megalith"
# What each sub-package must not import (top-level module names).
FORBIDDEN_IMPORTS = {
    "megalith_comm": {"megalith_zero", "megalith_pipeline", "megalith_offload"},
    "megalith_zero": {"megalith_pipeline", "megalith_offload"},
    "megalith_pipeline": {"megalith_zero", "megalith_offload"},
    "megalith_offload": {"megalith_zero", "megalith_pipeline"},
}
# Allowed only behind a guard (optional dependencies).
GUARDED_ALLOWED = {("megalith_zero", "megalith_offload")}
OURS = {FLOOR, ROOF, *FORBIDDEN_IMPORTS}


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
    """(absolute module name, line, guarded) for every absolute import in source.

    `from pkg.mod import name` records pkg.mod.name: the name may be a submodule, and
    a private name (`_EngineAdam`) is as private as a private module."""
    tree = ast.parse(source)
    found = []

    def visit(node: ast.AST, guarded: bool) -> None:
        if isinstance(node, ast.Import):
            found.extend((alias.name, node.lineno, guarded) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.extend((f"{node.module}.{a.name}", node.lineno, guarded) for a in node.names)
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


def _private_part(module: str) -> str | None:
    """The first `_name` part of a dotted name below its top level (dunders are public)."""
    for part in module.split(".")[1:]:
        if part.startswith("_") and not part.startswith("__"):
            return part
    return None


def import_violations(package: str, source: str) -> list[str]:
    """'line: reason' for each import `package` may not make."""
    out = []
    for module, line, guarded in imports_of(source):
        top = module.split(".")[0]
        if top not in OURS or top == package:
            continue
        if top == ROOF:
            out.append(f"{line}: imports {module} (the roof dist; below it use {FLOOR})")
            continue
        if package == FLOOR:
            out.append(f"{line}: imports {top} (the floor imports nothing of megalith's)")
            continue
        if top in FORBIDDEN_IMPORTS.get(package, ()):
            if (package, top) in GUARDED_ALLOWED and guarded:
                continue
            how = " unguarded" if (package, top) in GUARDED_ALLOWED else ""
            out.append(f"{line}: imports {top}{how}")
            continue
        private = _private_part(module)
        if private and not (top == FLOOR and private == "_engine"):
            out.append(f"{line}: imports {module} (private to {top}: {private})")
    return out


def _package_sources() -> dict[str, list[Path]]:
    sources = {FLOOR: sorted((ROOT / "python" / FLOOR).rglob("*.py"))}
    for name in SUBPACKAGES:
        src = ROOT / "packages" / name / "src" / f"megalith_{name}"
        assert (src / "__init__.py").is_file(), f"{src}/__init__.py is missing"
        sources[f"megalith_{name}"] = sorted(src.rglob("*.py"))
    return sources


def test_floor_and_subpackages_import_only_downwards():
    checked = 0
    violations = []
    for package, paths in _package_sources().items():
        for path in paths:
            checked += 1
            for v in import_violations(package, path.read_text()):
                violations.append(f"{path.relative_to(ROOT)}:{v}")
    assert checked > len(SUBPACKAGES) + 1
    assert not violations, (
        "packages may import only what is below them (docs/DESIGN.md, Layers):\n  "
        + "\n  ".join(violations)
    )


def import_graph(sources: dict[str, list[Path]]) -> dict[str, set[str]]:
    """Package -> the packages of ours it imports (guarded imports included)."""
    graph: dict[str, set[str]] = {}
    for package, paths in sources.items():
        deps = graph.setdefault(package, set())
        for path in paths:
            for module, _, _ in imports_of(path.read_text()):
                top = module.split(".")[0]
                if top in OURS and top != package:
                    deps.add(top)
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of the graph as [a, b, ..., a], or None."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for dep in sorted(graph.get(node, ())):
            if state.get(dep) == 1:
                return [*stack[stack.index(dep) :], dep]
            if dep not in state and (cycle := visit(dep)):
                return cycle
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_no_import_cycle_across_packages():
    sources = _package_sources()
    sources[ROOF] = sorted((ROOT / "packages" / "megalith" / "src" / ROOF).rglob("*.py"))
    cycle = find_cycle(import_graph(sources))
    assert cycle is None, "an import cycle across packages: " + " -> ".join(cycle or [])


def test_cycle_finder():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"x": {"y"}, "y": {"y"}}) == ["y", "y"]


# -- dist metadata ----------------------------------------------------------------


def _dist_dependencies(pyproject: Path) -> tuple[str, list[str]]:
    """(dist name, names of its required and optional dependencies) from a pyproject."""
    import tomllib

    project = tomllib.loads(pyproject.read_text())["project"]
    deps = list(project.get("dependencies", []))
    for extra in project.get("optional-dependencies", {}).values():
        deps.extend(extra)
    return project["name"], [re.split(r"[\s<>=!~;\[]", d, maxsplit=1)[0].lower() for d in deps]


def dist_violations(pyprojects: list[Path]) -> list[str]:
    out = []
    for pyproject in pyprojects:
        name, deps = _dist_dependencies(pyproject)
        ours = [d for d in deps if d == ROOF or d.startswith("megalith-")]
        if name == "megalith-core" and ours:
            out.append(f"{name} depends on {', '.join(ours)} (the floor depends on none of ours)")
        elif name != ROOF and ROOF in ours:
            out.append(f"{name} depends on the roof dist {ROOF}")
    return out


def test_no_package_dist_depends_on_the_roof():
    pyprojects = [ROOT / "pyproject.toml", *sorted((ROOT / "packages").glob("*/pyproject.toml"))]
    names = [_dist_dependencies(p)[0] for p in pyprojects]
    assert names[0] == "megalith-core" and ROOF in names, names
    assert not dist_violations(pyprojects)


def test_dist_checker(tmp_path):
    def write(name: str, deps: list[str], extra: list[str] = ()) -> Path:
        path = tmp_path / name / "pyproject.toml"
        path.parent.mkdir()
        path.write_text(
            f"[project]\nname = {name!r}\ndependencies = {deps!r}\n"
            f"[project.optional-dependencies]\nx = {list(extra)!r}\n"
        )
        return path

    assert dist_violations(
        [
            write("megalith-core", ["torch>=2.4"]),
            write("megalith-zero", ["megalith-core>=0.1", "megalith-comm"]),
            write("megalith", ["megalith-zero>=0.1"]),
            write("megalith-bad", ["torch", "megalith >=0.1"]),
            write("megalith-worse", ["torch"], ["megalith[test]"]),
        ]
    ) == [
        "megalith-bad depends on the roof dist megalith",
        "megalith-worse depends on the roof dist megalith",
    ]
    assert dist_violations([write("x", [])]) == []
    core = tmp_path / "c2"
    core.mkdir()
    (core / "pyproject.toml").write_text(
        '[project]\nname = "megalith-core"\ndependencies = ["megalith-comm"]\n'
    )
    assert dist_violations([core / "pyproject.toml"]) == [
        "megalith-core depends on megalith-comm (the floor depends on none of ours)"
    ]


@pytest.mark.parametrize(
    ("package", "source", "expected"),
    [
        ("megalith_comm", "import torch\nfrom megalith_core import _engine\n", []),
        ("megalith_comm", "import megalith_core._engine as e\n", []),
        ("megalith_zero", "from megalith_core.optim import functional as F\n", []),
        ("megalith_core", "from megalith_core.optim import functional as F\n", []),
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
            ["1: imports megalith.booster.Booster (the roof dist; below it use megalith_core)"],
        ),
        (
            "megalith_zero",
            "from megalith import _engine\n",
            ["1: imports megalith._engine (the roof dist; below it use megalith_core)"],
        ),
        (
            "megalith_zero",
            "import megalith\n",
            ["1: imports megalith (the roof dist; below it use megalith_core)"],
        ),
        (
            "megalith_core",
            "import megalith_comm\n",
            ["1: imports megalith_comm (the floor imports nothing of megalith's)"],
        ),
        (
            "megalith_zero",
            "from megalith_core.optim.adam import _EngineAdam\n",
            [
                "1: imports megalith_core.optim.adam._EngineAdam "
                "(private to megalith_core: _EngineAdam)"
            ],
        ),
        (
            "megalith_offload",
            "from megalith_comm._impl import x\n",
            ["1: imports megalith_comm._impl.x (private to megalith_comm: _impl)"],
        ),
        ("megalith_offload", "from megalith_comm import __version__\n", []),
    ],
)
def test_import_checker(package, source, expected):
    assert import_violations(package, source) == expected
