"""The strategy options of `megalith train` and `megalith plan`: one set, one name per
concept, read into a megalith.strategy.Strategy by Strategy.from_cli.

Old spellings keep working and print a one-line note naming the new one:

    --offload cpu      ->  --offload host
    --nvme-masters     ->  --master-tier nvme
    --stage 1|2|3      ->  --plugin zero1|zero2|gemini

Kept light (argparse only): every subcommand's parser is built at each start.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

PLUGINS = ("ddp", "zero1", "zero2", "gemini")
OFFLOAD = ("none", "host", "nvme", "host+nvme", "auto")
TIERS = ("host", "nvme")
PRECISIONS = ("fp32", "bf16", "fp16")
_STAGE_PLUGIN = {1: "zero1", 2: "zero2", 3: "gemini"}


def deprecated(parser: argparse.ArgumentParser, old: str, new: str) -> None:
    print(f"{parser.prog}: note: {old} is deprecated; use {new}", file=sys.stderr)


class _Offload(argparse.Action):
    def __call__(self, parser, namespace, value: Any, option_string: str | None = None) -> None:
        if value == "cpu":
            deprecated(parser, "--offload cpu", "--offload host")
            value = "host"
        setattr(namespace, self.dest, value)


class _Stage(argparse.Action):
    """--stage N (old `megalith plan`): the plugin that runs ZeRO stage N."""

    def __call__(self, parser, namespace, value: Any, option_string: str | None = None) -> None:
        plugin = _STAGE_PLUGIN[value]
        deprecated(parser, f"--stage {value}", f"--plugin {plugin}")
        setattr(namespace, self.dest, plugin)


class _NvmeMasters(argparse.Action):
    """--nvme-masters (old `megalith train`): --master-tier nvme."""

    def __call__(self, parser, namespace, value: Any, option_string: str | None = None) -> None:
        deprecated(parser, "--nvme-masters", "--master-tier nvme")
        setattr(namespace, self.dest, "nvme")


def add_strategy_options(
    p: argparse.ArgumentParser,
    *,
    plugin: str,
    precision: str | None,
    precision_help: str,
    auto: bool = False,
) -> None:
    """Adds the options a Strategy is read from; `plugin` and `precision` are this
    command's defaults (precision None: Strategy.from_cli's default_precision); auto:
    --plugin auto too (the planner chooses; megalith train)."""
    g = p.add_argument_group("strategy")
    g.add_argument(
        "--plugin",
        default=plugin,
        choices=(*PLUGINS, "auto") if auto else PLUGINS,
        help="parallelism: ddp, zero1, zero2 (ZeRO stage 1, 2) or gemini (stage 3)"
        + (", or auto (the planner chooses, and writes plan.json)" if auto else "")
        + f" (default: {plugin})",
    )
    g.add_argument(
        "--stage", dest="plugin", type=int, choices=(1, 2, 3), action=_Stage,
        default=argparse.SUPPRESS, help=argparse.SUPPRESS,
    )  # fmt: skip
    g.add_argument("--precision", default=precision, choices=PRECISIONS, help=precision_help)
    g.add_argument(
        "--offload",
        default="none",
        choices=(*OFFLOAD, "cpu"),
        metavar="{" + ",".join(OFFLOAD) + "}",
        action=_Offload,
        help="where fp32 masters and optimizer states live: host (host memory), nvme (files "
        "under --swap-dir), host+nvme (host memory up to --host-budget-gb, NVMe past it), or "
        "auto (the first step runs with them on the host, then what fits --device-budget-gb "
        "comes back to the device; with --plugin gemini parameter shards too); needs "
        "megalith-offload; --plugin ddp runs as zero2 then (default: none)",
    )
    g.add_argument(
        "--optim-frac",
        type=float,
        default=1.0,
        help="static offload: the fraction of chunks offloaded (default: 1.0)",
    )
    g.add_argument(
        "--param-frac",
        type=float,
        default=0.0,
        help="--plugin gemini: the fraction of chunks whose parameter shards are offloaded too",
    )
    g.add_argument(
        "--param-tier", default="host", choices=TIERS, help="where those parameter shards go"
    )
    g.add_argument(
        "--master-tier",
        default="host",
        choices=TIERS,
        help="with --offload nvme or host+nvme: nvme puts the fp32 masters of NVMe chunks in "
        "the swap files too, beside their states (host RAM then holds only staging; each step "
        "moves 4 more bytes per parameter each way) (default: host)",
    )
    g.add_argument(
        "--nvme-masters", dest="master_tier", nargs=0, action=_NvmeMasters,
        default=argparse.SUPPRESS, help=argparse.SUPPRESS,
    )  # fmt: skip
    g.add_argument(
        "--device-budget-gb",
        type=float,
        default=None,
        help="with --offload auto: every byte (GB) the step may use on the device (default: the "
        "GPU's; required on CPU ranks, a simulated device); with static offload: at most this "
        "many GB of masters and states stay on the device",
    )
    g.add_argument(
        "--host-budget-gb",
        type=float,
        default=None,
        help="at most this many GB of host memory for offloaded state (needed by host+nvme)",
    )
    g.add_argument(
        "--swap-dir",
        default=None,
        help="with --offload nvme or host+nvme: where the per-run swap directory goes",
    )
