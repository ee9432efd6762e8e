"""`python -m megalith.train`: what each rank runs (started by `megalith train`)."""

from __future__ import annotations

import argparse
import sys

from .options import add_options


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="megalith train")
    add_options(parser)
    args = parser.parse_args(argv)
    from .loop import train

    return train(args)


if __name__ == "__main__":
    sys.exit(main())
