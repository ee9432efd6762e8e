"""A Strategy from the options of megalith.cli.options (`megalith train`, `megalith plan`).

Option combinations that cannot work fail here with the options' own names; the rest is
the Strategy's and OffloadConfig's own checking. Every error is a ValueError, which the
commands print as `megalith <command>: <message>`.
"""

from __future__ import annotations

import argparse
from typing import Any

from .strategy import Strategy

GB = 1e9
_NVME = ("nvme", "host+nvme")


def _gb(value: float | None) -> int | None:
    return None if value is None else int(value * GB)


def _check(args: argparse.Namespace) -> None:
    offload = args.offload
    if args.swap_dir is not None and offload not in _NVME:
        raise ValueError(
            f"--swap-dir {args.swap_dir} is for --offload nvme or host+nvme "
            f"(got --offload {offload})"
        )
    if args.master_tier == "nvme" and offload not in _NVME:
        raise ValueError(
            f"--master-tier nvme is for --offload nvme or host+nvme (got --offload {offload})"
        )
    for name in ("device_budget_gb", "host_budget_gb"):
        if getattr(args, name) is not None and offload == "none":
            raise ValueError(
                f"--{name.replace('_', '-')} is for --offload auto, host, nvme or host+nvme "
                "(got --offload none)"
            )
    budget = args.device_budget_gb
    if offload == "auto" and budget is not None and not budget > 0:
        raise ValueError(f"--device-budget-gb {budget}; expected a positive size")
    if offload == "none":
        for name, default in (("optim_frac", 1.0), ("param_frac", 0.0), ("param_tier", "host")):
            if getattr(args, name) != default:
                raise ValueError(
                    f"--{name.replace('_', '-')} {getattr(args, name)} is for an offloaded run: "
                    "add --offload host, nvme or host+nvme"
                )


def _offload_config(args: argparse.Namespace) -> Any:
    if args.offload == "none":
        return None
    try:
        from megalith_offload import OffloadConfig
    except ImportError:
        raise ValueError(
            f"--offload {args.offload} needs megalith-offload: pip install megalith-offload"
        ) from None
    auto = args.offload == "auto"
    return OffloadConfig(
        tier="host" if auto else args.offload,
        placement="auto" if auto else "static",
        optim_frac=args.optim_frac,
        param_frac=args.param_frac,
        param_tier=args.param_tier,
        master_tier=args.master_tier,
        device_budget_bytes=_gb(args.device_budget_gb),
        host_budget_bytes=_gb(args.host_budget_gb),
        swap_dir=args.swap_dir,
    )


def strategy_from_args(args: argparse.Namespace, *, default_precision: str = "fp32") -> Strategy:
    """The Strategy the options name.

    default_precision: used when --precision is not given (`megalith train`: bf16 on
    GPUs, fp32 on CPU ranks). --max-norm, where the command has it, is the strategy's
    clipping. --plugin ddp with --offload runs as zero2: offloading moves ZeRO's sharded
    state, and ZeRO-2 is DDP's nearest.
    """
    _check(args)
    offload = _offload_config(args)
    plugin = args.plugin
    if offload is not None and plugin == "ddp":
        plugin = "zero2"
    return Strategy(
        plugin=plugin,
        precision=args.precision or default_precision,
        offload=offload,
        max_norm=getattr(args, "max_norm", 0.0),
    )
