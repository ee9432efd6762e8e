"""The `megalith` command line (also `python -m megalith`); see megalith.cli.main."""
