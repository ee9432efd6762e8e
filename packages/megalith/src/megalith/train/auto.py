"""`megalith train --plugin auto`: the run's AutoPlugin, its plan.json, and the summary's
predicted-against-measured lines.

The global batch is what the other plugins would train: --batch-size sequences per rank
times the ranks, of --seq-len tokens; each data-parallel rank of the plan feeds its share
(loop.py asks the plugin for dp_rank_size). A plan with pp > 1 is trained through
booster.execute_pipeline (pipeline_steps.py), its micro-batches the plan's;
--activation-checkpointing fixes checkpointing to every layer, --plan-fix fixes any
other knob (pp=2,schedule=zbv), --device-budget-gb / --host-budget-gb are the memory it
plans for, and offloading is the planner's to choose (--offload and its options are
refused). plan.json records the fixed knobs under "fixed".

Measured step time: the mean `step_s` of metrics.jsonl's steady steps (the summary's
figure). Measured peak memory: torch.cuda.max_memory_allocated on GPUs; on CPU ranks the
process's peak resident set (ru_maxrss, the summary's `peak memory / rank`), which is what
the planner's CPU estimate includes (its baseline is a process with torch imported).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from megalith_core.atomic_files import atomic_write_json

from .progress import human_bytes

#: options of the hand-chosen plugins that --plugin auto decides itself, at their defaults
_OFFLOAD_DEFAULTS = {
    "offload": "none",
    "optim_frac": 1.0,
    "param_frac": 0.0,
    "param_tier": "host",
    "master_tier": "host",
    "swap_dir": None,
}


def is_auto(args: argparse.Namespace) -> bool:
    return getattr(args, "plugin", None) == "auto"


def check_args(args: argparse.Namespace) -> None:
    """ValueError naming the option that --plugin auto cannot take."""
    for name, default in _OFFLOAD_DEFAULTS.items():
        value = getattr(args, name, default)
        if value != default:
            raise ValueError(
                f"--{name.replace('_', '-')} {value} with --plugin auto, which chooses "
                "offloading itself; leave it out, or choose the plugin by hand "
                "(--plugin zero2 --offload host ...)"
            )
    for name in ("device_budget_gb", "host_budget_gb"):
        value = getattr(args, name, None)
        if value is not None and not value > 0:
            raise ValueError(f"--{name.replace('_', '-')} {value}; expected a positive size")
    fixed_knobs(args)


def _value(text: str) -> Any:
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def fixed_knobs(args: argparse.Namespace) -> dict[str, Any]:
    """The plan's fixed knobs: --plan-fix KNOB=VALUE,... and --activation-checkpointing
    (ValueError naming a malformed or unknown knob)."""
    from megalith.autoparallel.space import KNOBS

    fixed: dict[str, Any] = {}
    text = getattr(args, "plan_fix", None) or ""
    for item in filter(None, (x.strip() for x in text.split(","))):
        name, eq, value = item.partition("=")
        name = name.strip()
        if not eq or not value.strip():
            raise ValueError(f"--plan-fix {text!r}: {item!r} is not KNOB=VALUE (e.g. pp=2)")
        if name not in KNOBS:
            raise ValueError(f"--plan-fix: unknown knob {name!r}; the knobs are {', '.join(KNOBS)}")
        fixed[name] = _value(value.strip())
    if getattr(args, "activation_checkpointing", False):
        if fixed.get("ckpt", 1.0) != 1.0:
            raise ValueError(
                f"--plan-fix ckpt={fixed['ckpt']} with --activation-checkpointing (every "
                "layer); give one of them"
            )
        fixed["ckpt"] = 1.0
    return fixed


def make_plugin(args: argparse.Namespace, world_size: int, precision: str) -> Any:
    from megalith.booster import AutoPlugin

    return AutoPlugin(
        seq_len=args.seq_len,
        global_batch_tokens=args.batch_size * args.seq_len * world_size,
        precision=precision,
        max_pp=None,
        device_budget_gb=args.device_budget_gb,
        host_budget_gb=args.host_budget_gb,
        max_norm=args.max_norm,
        constraints=fixed_knobs(args) or None,
    )


def write_plan(run_dir: Path, plugin: Any) -> Path:
    """runs/NAME/plan.json: {"chosen": candidate, "candidates": runner-ups, "fixed": the
    knobs fixed by --plan-fix / --activation-checkpointing, ...}."""
    path = run_dir / "plan.json"
    atomic_write_json(path, {**plugin.plan.to_json(), "fixed": plugin.constraints}, indent=1)
    return path


def summary_rows(plugin: Any, steady: list[dict[str, Any]], device: str) -> list[tuple[str, str]]:
    """The summary's lines on the plan: predicted against measured."""
    chosen = plugin.plan.chosen
    step = sum(r["step_s"] for r in steady) / len(steady)
    peak = max(r["peak_bytes"] for r in steady)
    basis = "torch.cuda.max_memory_allocated" if device == "cuda" else "peak RSS"
    return [
        ("plan", plugin.plan.summary().split("; predicted")[0]),
        (
            "step, planned",
            f"predicted {chosen.predicted_step_s * 1e3:.1f} ms, measured {step * 1e3:.1f} ms "
            f"({step / chosen.predicted_step_s:.2f}x)",
        ),
        (
            "peak / rank, planned",
            f"predicted {human_bytes(chosen.predicted_peak_bytes)}, measured "
            f"{human_bytes(peak)} ({basis}; {peak / chosen.predicted_peak_bytes:.2f}x)",
        ),
    ]
