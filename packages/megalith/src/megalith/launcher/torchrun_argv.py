"""Reading torchrun's own options out of its argv (the part before the script)."""

from __future__ import annotations


def option_value(head: list[str], *names: str) -> str | None:
    """The value of the last of `names` in head, given as `--name value` or `--name=value`."""
    value = None
    for i, arg in enumerate(head):
        for name in names:
            if arg == name and i + 1 < len(head):
                value = head[i + 1]
            elif arg.startswith(name + "="):
                value = arg.split("=", 1)[1]
    return value
