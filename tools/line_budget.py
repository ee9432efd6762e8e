#!/usr/bin/env python3
"""Line budget: one concept per file (STYLE.md, Sizes).

Lists every source file over the warning size (600 lines: a sign that it holds
two ideas) and exits 1 when a file under core/, python/ or packages/ is over the
hard limit (800 lines). Files are those git knows (tracked, or untracked and
not ignored); outside a git checkout every file under the root is read.

    python tools/line_budget.py [--root DIR] [--warn 600] [--limit 800]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

WARN_LINES = 600
LIMIT_LINES = 800
# The hard limit applies under these top-level folders; elsewhere (tests,
# benchmarks, examples, tools) an oversize file is only listed.
ENFORCED_DIRS = ("core", "python", "packages")
SOURCE_SUFFIXES = {
    ".py",
    ".pyi",
    ".h",
    ".hpp",
    ".c",
    ".cc",
    ".cpp",
    ".cxx",
    ".cu",
    ".cuh",
    ".cmake",
    ".in",
}
SOURCE_NAMES = {"CMakeLists.txt"}
SKIP_DIRS = {".git", "build", "_skbuild", "dist", "__pycache__", ".venv", "venv", "node_modules"}


def source_files(root: Path) -> list[Path]:
    """Source files under root, relative to it."""
    try:
        out = subprocess.run(
            ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
            cwd=root,
            capture_output=True,
            check=True,
        ).stdout
        names = [Path(n) for n in out.decode().split("\0") if n]
        # Only the repository that root is the top of: skip when root is a subfolder.
        top = subprocess.run(
            ["git", "rev-parse", "--show-toplevel"], cwd=root, capture_output=True, check=True
        )
        if Path(top.stdout.decode().strip()).resolve() != root.resolve():
            raise subprocess.CalledProcessError(1, "git")
    except (OSError, subprocess.CalledProcessError):
        names = [
            p.relative_to(root)
            for p in root.rglob("*")
            if p.is_file() and not SKIP_DIRS.intersection(p.relative_to(root).parts)
        ]
    return sorted(n for n in names if (n.suffix in SOURCE_SUFFIXES or n.name in SOURCE_NAMES))


def count_lines(path: Path) -> int:
    with path.open("rb") as f:
        return sum(1 for _ in f)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=Path(__file__).resolve().parents[1])
    parser.add_argument("--warn", type=int, default=WARN_LINES)
    parser.add_argument("--limit", type=int, default=LIMIT_LINES)
    args = parser.parse_args(argv)

    over_limit = []
    listed = 0
    for rel in source_files(args.root):
        path = args.root / rel
        if not path.is_file():  # deleted but still in the index
            continue
        lines = count_lines(path)
        if lines <= args.warn:
            continue
        enforced = rel.parts[0] in ENFORCED_DIRS
        if enforced and lines > args.limit:
            over_limit.append(rel)
            mark = f"OVER LIMIT ({args.limit})"
        else:
            mark = "split it?"
        print(f"{lines:6d}  {rel}  {mark}")
        listed += 1

    if over_limit:
        print(
            f"\n{len(over_limit)} file(s) under {', '.join(ENFORCED_DIRS)} exceed {args.limit} "
            "lines; split each into files of one concept (STYLE.md, Sizes).",
            file=sys.stderr,
        )
        return 1
    print(f"line budget ok: {listed} file(s) over {args.warn} lines, none over {args.limit}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
