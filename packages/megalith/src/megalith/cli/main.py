"""Entry point of the `megalith` command and of `python -m megalith`.

The top level answers where the installed pieces are (--cmake-dir,
--include-dir, --version); everything else is a subcommand. Each subcommand is
one module of this package that defines

    add_parser(subparsers) -> argparse.ArgumentParser

which registers its parser and sets `func`, a callable taking the parsed
arguments and returning the exit code. To add one (`run`, `train`), write
megalith/cli/<name>.py and add <name> to SUBCOMMANDS. Modules must keep their
top-level imports light (no torch, no engine): every one is imported to build
the parser.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

import megalith

SUBCOMMANDS = ("calibrate", "env", "plan", "run", "sample", "train")


def build_parser(prog: str = "megalith") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog,
        description="megalith: distributed training for PyTorch on a C++/CUDA engine.",
    )
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--version", action="store_true", help="print megalith's version")
    where.add_argument(
        "--cmake-dir",
        action="store_true",
        help="print the directory holding megalithConfig.cmake (for CMAKE_PREFIX_PATH)",
    )
    where.add_argument("--include-dir", action="store_true", help="print the C++ include directory")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in SUBCOMMANDS:
        importlib.import_module(f"{__package__}.{name}").add_parser(subparsers)
    return parser


def main(argv: Sequence[str] | None = None, prog: str = "megalith") -> int:
    parser = build_parser(prog)
    args = parser.parse_args(argv)
    try:
        if args.version:
            print(megalith.__version__)
            return 0
        if args.cmake_dir:
            print(megalith.get_cmake_dir())
            return 0
        if args.include_dir:
            print(megalith.get_include())
            return 0
    except FileNotFoundError as exc:
        print(f"{parser.prog}: error: {exc}", file=sys.stderr)
        return 1
    if args.command is None:
        parser.print_help()
        return 0
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
