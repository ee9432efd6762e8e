"""`megalith plan`: where ZeRO and its offloading would put a model's training state, and
whether it fits, before any GPU time is spent. Nothing is allocated: the model is built
on the meta device.

    megalith plan --model gpt-6.7b --plugin zero2 --offload host
    megalith plan --model gpt-13b --layers 57 --offload host+nvme \\
        --device-budget-gb 60 --host-budget-gb 110 --gpu-gb 139
    megalith plan --auto --model llama-7b --profile h200 --gpus 8   # the planner chooses

Per rank: the chunks per tier, the device bytes by kind (working params, gradients,
gathered chunks, masters and optimizer states), host and NVMe bytes. Activations come
on top of the device figure (`--offload auto` measures them in its warm-up step).
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from megalith.cli import plan_auto
from megalith.cli.options import add_strategy_options

if TYPE_CHECKING:
    from megalith.strategy import Strategy
    from megalith_zero.estimate import Estimate

GB = 1e9


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "plan",
        help="where a model's training state would go (GPU, host, NVMe), without a GPU",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_strategy_options(p, plugin="zero2", precision="bf16", precision_help="(default: bf16)")
    p.add_argument(
        "--model",
        default="gpt-1.3b",
        help="a megalith.models preset (with --auto also a transformers model directory)",
    )
    p.add_argument("--layers", type=int, default=0, help="override the preset's layer count")
    p.add_argument("--world", type=int, default=1, help="data-parallel ranks (default: 1)")
    p.add_argument(
        "--gpu-gb",
        type=float,
        default=None,
        help="say whether the device bytes fit this much; with --auto: memory per device",
    )
    plan_auto.add_options(p)
    p.set_defaults(func=run)
    return p


def run(args: argparse.Namespace) -> int:
    if args.auto:
        return plan_auto.run(args)
    stray = plan_auto.auto_only(args)
    if stray:
        raise SystemExit(f"megalith plan: {stray} plans with the planner: add --auto")
    import torch

    from megalith import models
    from megalith.strategy import Strategy

    try:
        from megalith_zero.estimate import estimate
    except ImportError:
        raise SystemExit("megalith plan: needs megalith-zero: pip install megalith-zero") from None
    if args.world < 1:
        raise SystemExit(f"megalith plan: --world {args.world}; expected >= 1")
    try:
        strategy = Strategy.from_cli(args)
        config = strategy.zero_config()
    except ValueError as e:
        raise SystemExit(f"megalith plan: {e}") from None
    overrides = {"n_layers": args.layers} if args.layers else {}
    model = models.create(args.model, **overrides)  # meta: nothing allocated
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    try:
        e = estimate(model, optimizer, config, args.world)
    except ValueError as err:  # a budget the plan cannot meet says by how much
        raise SystemExit(f"megalith plan: {err}") from None
    print(_report(args, strategy, e))
    if args.gpu_gb is not None and e.device_bytes > args.gpu_gb * GB:
        return 1
    return 0


def _report(args: argparse.Namespace, strategy: Strategy, e: Estimate) -> str:
    where = f"ZeRO-{strategy.zero_stage} at {args.world} rank(s), {strategy.precision}"
    if args.offload != "none":
        where += f", offload {args.offload}"
    lines = [
        f"{args.model}: {e.params / 1e9:.2f}B parameters in {e.chunks} chunks of up to "
        f"{e.chunk_bytes / 2**20:.0f} MiB; {where}",
        "chunks' masters and states per tier: " + ", ".join(f"{t} {n}" for t, n in e.tiers.items()),
        f"per rank: device {e.device_bytes / GB:.1f} GB ("
        + ", ".join(f"{k} {v / GB:.1f}" for k, v in e.device.items() if v)
        + f"), host {e.host_bytes / GB:.1f} GB, NVMe {e.nvme_bytes / GB:.1f} GB",
        "activations and allocator slack come on top of the device figure",
    ]
    if args.gpu_gb is not None:
        left = args.gpu_gb - e.device_bytes / GB
        verdict = (
            f"fits, {left:.1f} GB left for activations"
            if left >= 0
            else (
                f"does not fit: {-left:.1f} GB over; offload more (--offload, --optim-frac, "
                "--param-frac at stage 3) or add ranks (--world)"
            )
        )
        lines.append(f"on a {args.gpu_gb:g} GB device: {verdict}")
    return "\n".join(lines)
