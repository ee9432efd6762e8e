"""`megalith train --config FILE`: a TOML file whose keys are the option names (with
dashes or underscores); the command line overrides it. The resolved options are saved
as runs/NAME/config.toml, which --config takes back."""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

import tomllib

from megalith_core.atomic_files import atomic_write_text

#: options that are not the run's (not saved, not taken from a file)
_NOT_SAVED = {"func", "command", "config", "resume", "overwrite", "stop_after", "version"}


def _actions(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    """Each dest's action, the one named like it where several share it (--plugin, --stage)."""
    out: dict[str, argparse.Action] = {}
    for a in parser._actions:
        if a.dest in ("help", argparse.SUPPRESS):
            continue
        if a.dest not in out or "--" + a.dest.replace("_", "-") in a.option_strings:
            out[a.dest] = a
    return out


def load(path: str, parser: argparse.ArgumentParser) -> dict[str, Any]:
    """The file's options as parsed values, by dest; ValueError naming a bad key or value."""
    try:
        with open(path, "rb") as f:
            raw = tomllib.load(f)
    except OSError as e:
        raise ValueError(f"--config {path}: {e.strerror or e}") from None
    except tomllib.TOMLDecodeError as e:
        raise ValueError(f"--config {path}: not valid TOML ({e})") from None
    actions = _actions(parser)
    out: dict[str, Any] = {}
    for key, value in raw.items():
        dest = key.replace("-", "_")
        action = actions.get(dest)
        if action is not None and dest in _NOT_SAVED:
            raise ValueError(
                f"--config {path}: {key!r} is for the command line (this run's action, not "
                "one of its options); remove it from the file"
            )
        if action is None:
            raise ValueError(
                f"--config {path}: unknown key {key!r}; the keys are `megalith train` option "
                "names (see megalith train --help)"
            )
        out[dest] = _convert(path, key, value, action)
    return out


def _convert(path: str, key: str, value: Any, action: argparse.Action) -> Any:
    if isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction)):
        if not isinstance(value, bool):
            raise ValueError(f"--config {path}: {key} = {value!r}; expected true or false")
        return value
    if action.nargs == "?" and isinstance(value, bool):  # --compile: true = bare flag
        return action.const if value else None
    if isinstance(value, (dict, list)):
        raise ValueError(f"--config {path}: {key} = {value!r}; expected a single value")
    kind = action.type or str
    try:
        value = kind(str(value)) if kind is not str or not isinstance(value, str) else value
    except (TypeError, ValueError):
        raise ValueError(f"--config {path}: {key} = {value!r}; not a valid value") from None
    if action.choices is not None and value not in action.choices:
        choices = ", ".join(map(str, action.choices))
        raise ValueError(f"--config {path}: {key} = {value!r}; expected one of {choices}")
    return value


class ConfigParser(argparse.ArgumentParser):
    """An ArgumentParser that reads --config first: argparse fills in a default only where
    the namespace has no value yet, so the file beats the defaults and the command line
    beats the file."""

    def parse_known_args(self, args=None, namespace=None):  # type: ignore[override]
        first, _ = super().parse_known_args(args, None)
        path = getattr(first, "config", None)
        if not path:
            return super().parse_known_args(args, namespace)
        try:
            values = load(path, self)
        except ValueError as e:
            self.exit(2, f"megalith train: {e}\n")
        namespace = namespace if namespace is not None else argparse.Namespace()
        for key, value in values.items():
            if not hasattr(namespace, key):
                setattr(namespace, key, value)
        return super().parse_known_args(args, namespace)


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return ("-inf" if value < 0 else "inf") if math.isinf(value) else repr(value)
    if isinstance(value, int):
        return str(value)
    return json.dumps(str(value))  # a TOML basic string


def save(run_dir: Path, args: argparse.Namespace) -> Path:
    """runs/NAME/config.toml: every option of the run (unset ones left out)."""
    lines = ["# megalith train: the options of this run (megalith train --config this file)"]
    for key, value in sorted(vars(args).items()):
        if key in _NOT_SAVED or value is None or callable(value):
            continue
        lines.append(f"{key.replace('_', '-')} = {_toml_value(value)}")
    path = run_dir / "config.toml"
    atomic_write_text(path, "\n".join(lines) + "\n")
    return path
