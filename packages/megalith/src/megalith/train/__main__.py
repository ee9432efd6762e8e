"""`python -m megalith.train`: what each rank runs (started by `megalith train`)."""

from __future__ import annotations

import sys

from .config import ConfigParser
from .options import add_options


def main(argv: list[str] | None = None) -> int:
    parser = ConfigParser(prog="megalith train")
    add_options(parser)
    args = parser.parse_args(argv)
    from .loop import train

    return train(args)


if __name__ == "__main__":
    sys.exit(main())
