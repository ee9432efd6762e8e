"""`megalith plan --auto`: the AutoParallel planner from the command line.

    megalith plan --auto --model llama-7b --profile h200 --gpus 8
    megalith plan --auto --model llama-70b --profile h200 --gpus 8 --nodes 64 --json
    megalith plan --auto --model ./my-hf-model --nproc 4        # CPU ranks here

The model is a megalith.models preset or a local transformers directory (its
config.json; the model is built on the meta device, no weights are read). The cluster
is --nodes x --gpus devices of a machine profile (a built-in name or a JSON from
`megalith calibrate`), or with --nproc N, N ranks on this machine. Prints the ranked
plans, the winner's reason and one line per rejected family; --json prints the ranked
candidates as a JSON list, best first.

Every option is checked before the model is built; a bad one is a single line naming
the fix on stderr and exit status 2.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from megalith.autoparallel import Candidate, Cluster, MachineProfile

GB = 1e9
GIB = 2**30
#: the global batch when none is given, per device kind: about this many tokens, a whole
#: number of sequences per device (2^20: GPT-3's and Llama's batches are 0.5-4M tokens)
DEFAULT_BATCH_TOKENS = {"cuda": 2**20, "cpu": 2**14}
#: the link between nodes when --nodes > 1 and no figure is given: 8 x 400 Gb/s NICs
DEFAULT_INTER_NODE_GBS = 400.0
INTER_NODE_LATENCY_S = 10e-6
#: options of the exact `megalith plan` that the planner chooses itself
_CHOSEN = {
    "plugin": "zero2", "offload": "none", "world": 1, "optim_frac": 1.0, "param_frac": 0.0,
    "param_tier": "host", "master_tier": "host", "swap_dir": None,
}  # fmt: skip
#: the exact plan's budgets, and what --auto takes instead
_BUDGETS = {"device_budget_gb": "--gpu-gb", "host_budget_gb": "--host-gb"}


class UsageError(ValueError):
    """A bad option: one line, naming the fix."""


def add_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("--auto: the planner (the plugin, offload and layout are chosen)")
    g.add_argument(
        "--auto",
        action="store_true",
        help="search every dp x tp x pp x sp x ZeRO x offload x micro-batch x checkpointing "
        "x schedule plan on the cluster and rank them by predicted step time",
    )
    g.add_argument(
        "--gpus", type=int, default=None, help="devices per node (default: the profile's)"
    )
    g.add_argument("--nodes", type=int, default=None, help="nodes (default: 1)")
    g.add_argument("--host-gb", type=float, default=None, help="host memory per node, GB")
    g.add_argument(
        "--profile",
        default=None,
        help="machine profile: a built-in name (h200, ci_cpu) or a JSON from megalith "
        "calibrate (default: h200)",
    )
    g.add_argument(
        "--nproc",
        type=int,
        default=None,
        help="plan for N ranks on this machine (its GPUs, or CPU ranks without one), from "
        "the calibrated profile at the default path if there is one",
    )
    g.add_argument(
        "--inter-node-gbs",
        type=float,
        default=None,
        help=f"GB/s each way between nodes, per node (default: {DEFAULT_INTER_NODE_GBS:g})",
    )
    g.add_argument(
        "--global-batch-tokens",
        type=int,
        default=None,
        help="tokens of one optimizer step, a multiple of --seq-len (default: about 2^20, "
        "a whole number of sequences per device)",
    )
    g.add_argument("--seq-len", type=int, default=None, help="default: the model's maximum")
    g.add_argument("--top", type=int, default=10, help="plans shown (default: 10)")
    g.add_argument("--json", action="store_true", help="print the ranked plans as JSON")


def auto_only(args: argparse.Namespace) -> str:
    """The --auto options given without --auto, as text ("" if none)."""
    given = [
        "--" + key.replace("_", "-")
        for key in ("gpus", "nodes", "host_gb", "profile", "nproc", "inter_node_gbs",
                    "global_batch_tokens", "seq_len")
        if getattr(args, key) is not None
    ]  # fmt: skip
    given += ["--json"] if args.json else []
    return ", ".join(given)


@dataclass(frozen=True)
class _Model:
    """What the options say about the model, read without building it."""

    name: str
    hf_dir: Path | None
    max_seq_len: int


def run(args: argparse.Namespace) -> int:
    try:
        model_info = _check_model(args)
        cluster = _cluster(args)
        seq_len, tokens = _batch(args, model_info, cluster)
    except UsageError as e:
        return _fail(str(e))
    from megalith.autoparallel import analyze
    from megalith.autoparallel.search import NoFeasiblePlan, search

    try:
        model = _build(args, model_info)
        analysis = analyze(model, seq_len, precision=args.precision, name=model_info.name)
        ranked = search(
            analysis,
            cluster,
            global_batch_tokens=tokens,
            top=args.top,
            precision=args.precision,
            model=model,
        )
    except (NoFeasiblePlan, ValueError, OSError) as e:  # OSError: a transformers dir
        return _fail("; ".join(line.strip() for line in str(e).splitlines() if line.strip()))
    if args.json:
        print(json.dumps([c.to_json() for c in ranked], indent=1))
    else:
        print(_header(analysis, cluster, tokens))
        print(format_table(ranked))
        print(ranked[0].reason)
    return 0


def _fail(message: str) -> int:
    print(f"megalith plan: error: {message}", file=sys.stderr)
    return 2


# ------------------------------------------------------------------ checking the options


def _positive(value: float | None, flag: str, what: str) -> None:
    if value is not None and not value > 0:
        raise UsageError(f"{flag} {value:g}: {what} must be > 0")


def _check_numbers(args: argparse.Namespace) -> None:
    for flag, what in (
        ("gpus", "devices per node"),
        ("nodes", "the node count"),
        ("nproc", "the rank count"),
        ("gpu_gb", "device memory"),
        ("host_gb", "host memory"),
        ("inter_node_gbs", "the link between nodes"),
        ("seq_len", "the sequence length"),
        ("global_batch_tokens", "the global batch"),
        ("top", "the number of plans shown"),
    ):
        _positive(getattr(args, flag), "--" + flag.replace("_", "-"), what)
    for flag in ("gpus", "nodes", "nproc"):
        if getattr(args, flag) is not None and getattr(args, flag) > 1 << 20:
            raise UsageError(f"--{flag} {getattr(args, flag)}: more than 2^20; check the number")
    for key, default in _CHOSEN.items():
        flag = "--" + key.replace("_", "-")
        if getattr(args, key, default) != default:
            raise UsageError(
                f"{flag} with --auto: the planner chooses it; drop {flag}, or drop --auto "
                "for the exact memory estimate of one plan"
                + (" (--gpus and --nodes give the devices)" if key == "world" else "")
            )
    for key, instead in _BUDGETS.items():
        if getattr(args, key, None) is not None:
            flag = "--" + key.replace("_", "-")
            raise UsageError(f"{flag} is the exact plan's budget; with --auto give {instead}")
    if args.nproc is not None:
        clash = [f for f in ("gpus", "nodes", "profile") if getattr(args, f) is not None]
        if clash:
            raise UsageError(
                f"--nproc plans for this machine; it takes no --{', --'.join(clash)} (give "
                "those without --nproc to plan for a machine of a profile)"
            )


def _check_model(args: argparse.Namespace) -> _Model:
    _check_numbers(args)
    from megalith.models.presets import PRESETS

    name = args.model
    if name in PRESETS:
        if args.layers < 0:
            raise UsageError(f"--layers {args.layers}: give a positive layer count")
        return _Model(name, None, PRESETS[name].max_seq_len)
    path = Path(name).expanduser()
    config = path / "config.json"
    if not config.is_file():
        raise UsageError(
            f"unknown model {name!r}: not a megalith.models preset ({', '.join(PRESETS)}) "
            "and not a directory with a transformers config.json"
        )
    try:
        data = json.loads(config.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise UsageError(
            f"{config}: not a JSON config ({e}); give a transformers model directory"
        ) from None
    if not isinstance(data, dict) or "model_type" not in data:
        raise UsageError(f"{config}: no 'model_type'; give a transformers model directory")
    longest = data.get("max_position_embeddings") or data.get("n_positions") or 2048
    return _Model(path.resolve().name, path, int(longest))


def _load_profile(name: str) -> MachineProfile:
    from megalith.autoparallel.profiles import load_profile

    try:
        return load_profile(name)
    except ValueError as e:
        raise UsageError(f"--profile: {e}") from None


def _local_profile(nproc: int) -> MachineProfile:
    """This machine's profile for --nproc: the calibrated one if there is one of the right
    device kind, else the built-in of its kind."""
    import torch

    from megalith.autoparallel.profiles import builtin_profiles, default_profile_path

    device = "cuda" if torch.cuda.is_available() else "cpu"
    path = default_profile_path()
    if path.is_file():
        profile = _load_profile(str(path))
        if profile.device == device:
            return profile
    if device == "cpu":
        return _load_profile("ci_cpu")
    gpu = torch.cuda.get_device_name(0)
    if nproc > torch.cuda.device_count():
        raise UsageError(
            f"--nproc {nproc}: this machine has {torch.cuda.device_count()} GPU(s); give at "
            "most that, or --profile and --gpus to plan for another machine"
        )
    for name in builtin_profiles():
        profile = _load_profile(name)
        if profile.device == "cuda" and profile.device_name.lower() in gpu.lower():
            return profile
    raise UsageError(
        f"no profile for this machine's {gpu}: run `megalith calibrate` first (it writes "
        f"{path}), or give --profile FILE --gpus {nproc}"
    )


def _cluster(args: argparse.Namespace) -> Cluster:
    import dataclasses

    from megalith.autoparallel import AlphaBeta, Cluster
    from megalith.autoparallel.profiles import with_group_sizes

    if args.nproc is not None:
        profile = _local_profile(args.nproc)
        per_node, nodes = args.nproc, 1
        if profile.device == "cpu" and args.gpu_gb is None:  # CPU ranks share the host
            share = profile.host_memory_bytes // args.nproc
            profile = dataclasses.replace(profile, device_memory_bytes=share)
    else:
        profile = _load_profile(args.profile or "h200")
        per_node, nodes = args.gpus or profile.devices_per_node, args.nodes or 1
    sizes = sorted({2**i for i in range(1, per_node.bit_length())} | {per_node})
    inter = None
    if nodes > 1:
        gbs = args.inter_node_gbs or DEFAULT_INTER_NODE_GBS
        inter = AlphaBeta(latency_s=INTER_NODE_LATENCY_S, bandwidth=gbs * GB)
    return Cluster(
        profile=with_group_sizes(profile, [s for s in sizes if s >= 2]),
        nodes=nodes,
        gpus_per_node=per_node,
        inter_node=inter,
        device_memory_bytes=int(args.gpu_gb * GB) if args.gpu_gb else None,
        host_memory_bytes=int(args.host_gb * GB) if args.host_gb else None,
    )


def _batch(args: argparse.Namespace, model: _Model, cluster: Cluster) -> tuple[int, int]:
    """(seq_len, global batch tokens), checked against each other."""
    seq = args.seq_len or model.max_seq_len
    tokens = args.global_batch_tokens
    if tokens is None:
        want = DEFAULT_BATCH_TOKENS.get(cluster.profile.device, DEFAULT_BATCH_TOKENS["cuda"])
        per_device = max(1, math.ceil(want / (seq * cluster.world)))
        return seq, seq * cluster.world * per_device
    if tokens % seq:
        raise UsageError(
            f"--global-batch-tokens {tokens} is not a whole number of sequences of --seq-len "
            f"{seq}; give a multiple of {seq}, e.g. {max(1, tokens // seq) * seq}"
        )
    return seq, tokens


# ---------------------------------------------------------------------- the model, built


def _build(args: argparse.Namespace, info: _Model) -> Any:
    import torch

    if info.hf_dir is None:
        from megalith import models

        overrides = {"n_layers": args.layers} if args.layers else {}
        return models.create(info.name, **overrides)  # meta
    try:
        import transformers
    except ImportError:
        raise ValueError(
            f"{info.hf_dir} is a transformers model: pip install transformers"
        ) from None
    config = transformers.AutoConfig.from_pretrained(info.hf_dir)
    if args.layers:
        for key in ("num_hidden_layers", "n_layer", "num_layers"):
            if hasattr(config, key):
                setattr(config, key, args.layers)
    with torch.device("meta"):
        return transformers.AutoModelForCausalLM.from_config(config)


# --------------------------------------------------------------------------- the output


def _header(analysis: Any, cluster: Cluster, tokens: int) -> str:
    p = cluster.profile
    device = cluster.device_memory_bytes or p.device_memory_bytes
    where = f"{cluster.nodes} node(s) x {cluster.per_node} {p.device_name} (profile {p.name})"
    if cluster.inter_node is not None:
        where += f", {cluster.inter_node.bandwidth / GB:g} GB/s between nodes"
    return (
        f"{analysis.model}: {analysis.params / 1e9:.2f}B parameters, sequence "
        f"{analysis.seq_len}, global batch {tokens} tokens ({tokens // analysis.seq_len} "
        f"sequences), {analysis.param_dtype}\non {where}, {device / GB:.1f} GB "
        f"({device / GIB:.1f} GiB) per device"
    )


_COLUMNS = (
    ("#", 3), ("dp", 4), ("tp", 3), ("pp", 3), ("sp", 3), ("zero", 4), ("offload", 9),
    ("mb", 3), ("nmb", 5), ("ckpt", 4), ("schedule", 11), ("step s", 9),
    ("tokens/s", 11), ("MFU", 4), ("peak GiB", 8),
)  # fmt: skip


def _row(i: int, c: Candidate) -> list[str]:
    offload = "none" if c.offload == "none" else f"{c.offload} {c.offload_fraction:g}"
    return [
        str(i), str(c.dp), str(c.tp), str(c.pp), str(c.sp), str(c.zero_stage), offload,
        str(c.micro_batch), str(c.num_microbatches), f"{c.ckpt:g}", c.schedule,
        f"{c.predicted_step_s:.4g}", f"{c.predicted_tokens_per_s:,.0f}",
        f"{c.predicted_mfu:.0%}", f"{c.predicted_peak_bytes / GIB:.1f}",
    ]  # fmt: skip


def format_table(ranked: list[Candidate]) -> str:
    """One row per candidate, best first, right-aligned columns."""
    rows = [[name for name, _ in _COLUMNS]] + [_row(i, c) for i, c in enumerate(ranked, 1)]
    widths = [max(w, *(len(r[j]) for r in rows)) for j, (_, w) in enumerate(_COLUMNS)]
    return "\n".join(" ".join(v.rjust(w) for v, w in zip(r, widths)) for r in rows)
