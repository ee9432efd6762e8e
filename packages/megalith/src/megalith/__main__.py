"""`python -m megalith`: the same command line as `megalith` (megalith.cli.main)."""

import sys

from megalith.cli.main import main

if __name__ == "__main__":
    sys.exit(main(prog="python -m megalith"))
