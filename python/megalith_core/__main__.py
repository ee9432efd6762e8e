"""`python -m megalith_core --cmake-dir | --include-dir`: where the C++ library's files are,
for a C++ build that embeds the engine without the rest of megalith."""

from __future__ import annotations

import argparse
import sys

import megalith_core


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m megalith_core", description=__doc__)
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--cmake-dir", action="store_true", help="print the find_package dir")
    which.add_argument("--include-dir", action="store_true", help="print the include dir")
    args = parser.parse_args(argv)
    try:
        print(megalith_core.get_cmake_dir() if args.cmake_dir else megalith_core.get_include())
    except FileNotFoundError as exc:
        print(f"{parser.prog}: error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
