"""What AutoPlugin plans with: the machine profile of the devices it runs on, the cluster
of the ranks it sees, the search's constraints from its arguments, the Strategy of the
chosen Candidate, and one plan agreed by every rank.

Profiles, in order: the `profile` argument, then $MEGALITH_PROFILE (a built-in name or a
file), then on GPUs the profile `megalith calibrate` wrote at its default path, else the
built-in "h200"; on CPU ranks the built-in "ci_cpu".

Agreement: rank 0 plans and broadcasts the plan (or its error, which every rank then
raises); before that every rank gathers a fingerprint of its model and of the planning
arguments, so ranks that were given different models fail at once, named, instead of
choosing alike and hanging in the plugin's first collective.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from megalith.strategy import Parallel, Strategy

#: the planner's pipeline schedule -> HybridParallelPlugin's (pp_style, num_model_chunks)
PP_STYLE = {"1f1b": ("1f1b", 1), "interleaved": ("interleaved", 2), "zbv": ("zbv", 2)}
GB = 1e9


@dataclass(frozen=True)
class AutoPlan:
    """The chosen Candidate, the runner-ups (best first), and what was planned for."""

    chosen: Any  # megalith.autoparallel.Candidate
    candidates: tuple[Any, ...]
    profile: str
    world: int
    seq_len: int
    global_batch_tokens: int
    precision: str

    @property
    def per_rank_sequences(self) -> int:
        """Sequences each data-parallel rank feeds per optimizer step."""
        return self.chosen.micro_batch * self.chosen.num_microbatches

    def to_json(self) -> dict[str, Any]:
        return {
            "chosen": self.chosen.to_json(),
            "candidates": [c.to_json() for c in self.candidates],
            "profile": self.profile,
            "world": self.world,
            "seq_len": self.seq_len,
            "global_batch_tokens": self.global_batch_tokens,
            "precision": self.precision,
        }

    def summary(self) -> str:
        """One line: the plan and its prediction."""
        c = self.chosen
        offload = f", offload {c.offload} {c.offload_fraction:g}" if c.offload != "none" else ""
        pipe = f", {c.schedule}" if c.pp > 1 else ""
        return (
            f"{c.plugin}: dp{c.dp} tp{c.tp} pp{c.pp} sp{c.sp} zero{c.zero_stage}{offload}, "
            f"micro-batch {c.micro_batch} x {c.num_microbatches}, ckpt {c.ckpt:g}{pipe}; "
            f"predicted {c.predicted_step_s * 1e3:.1f} ms a step, "
            f"{c.predicted_tokens_per_s:,.0f} tokens/s, peak "
            f"{c.predicted_peak_bytes / GB:.2f} GB per rank (profile {self.profile})"
        )


def choose_profile(device: str, profile: Any = None) -> Any:
    """The MachineProfile to plan with (the order in the module docstring)."""
    from megalith.autoparallel.profiles import builtin_profiles, default_profile_path, load_profile
    from megalith.autoparallel.types import MachineProfile

    if isinstance(profile, MachineProfile):
        return profile
    named = profile or os.environ.get("MEGALITH_PROFILE")
    if named:
        return load_profile(named)
    if device != "cuda":
        return load_profile("ci_cpu")
    calibrated = default_profile_path()
    if calibrated.is_file():
        return load_profile(calibrated)
    if "h200" in builtin_profiles():
        return load_profile("h200")
    raise ValueError(
        f"AutoPlugin: no machine profile for this GPU: none at {calibrated} and no built-in "
        f"GPU profile (built-ins: {', '.join(builtin_profiles())}); measure this machine with "
        "`megalith calibrate` (it writes that file), or pass profile= (or set "
        "MEGALITH_PROFILE) to a profile file"
    )


def live_cluster(
    profile: Any,
    world: int,
    local_world: int,
    cluster: Any = None,
    device_budget_gb: float | None = None,
    host_budget_gb: float | None = None,
) -> Any:
    """The Cluster of the ranks this job runs on: world / local_world nodes of local_world
    devices each (or the given Cluster / cluster file), with the budgets as its memory."""
    import dataclasses

    from megalith.autoparallel.profiles import load_cluster, with_group_sizes
    from megalith.autoparallel.types import Cluster

    if isinstance(cluster, (str, Path)):
        cluster = load_cluster(cluster)
    if cluster is None:
        if local_world < 1 or world % local_world:
            local_world = world
        sizes = sorted({2**i for i in range(1, local_world.bit_length())} | {local_world})
        cluster = Cluster(
            profile=with_group_sizes(profile, [s for s in sizes if s >= 2]),
            nodes=world // local_world,
            gpus_per_node=local_world,
        )
        if cluster.nodes > 1:
            from megalith.logging import get_dist_logger

            get_dist_logger().warning(
                f"AutoPlugin: {cluster.nodes} nodes of {local_world} ranks, and no cluster "
                "file: the link between nodes is planned as if it were the one inside a "
                "node; pass cluster= a cluster file with inter_node to plan it right",
                ranks=[0],
            )
    if cluster.world != world:
        raise ValueError(
            f"AutoPlugin: the cluster has {cluster.nodes} x {cluster.per_node} = "
            f"{cluster.world} devices but the job runs {world} ranks; describe the job's "
            "ranks (or leave cluster= out: the ranks it sees are planned for)"
        )
    memory: dict[str, int] = {}
    if device_budget_gb is not None:
        memory["device_memory_bytes"] = _budget("device_budget_gb", device_budget_gb)
    if host_budget_gb is not None:
        memory["host_memory_bytes"] = _budget("host_budget_gb", host_budget_gb)
    return dataclasses.replace(cluster, **memory) if memory else cluster


def _budget(name: str, gb: float) -> int:
    if isinstance(gb, bool) or not isinstance(gb, (int, float)) or not gb > 0:
        raise ValueError(f"AutoPlugin: {name}={gb!r}; expected a positive size in GB")
    return int(gb * GB)


def checkpointable(model: torch.nn.Module) -> bool:
    """Whether apply_checkpointing can switch the model's layers (see checkpointing.py)."""
    if hasattr(model, "set_activation_checkpointing") and hasattr(model, "blocks"):
        return True
    return any(
        hasattr(model, n)
        for n in ("activation_checkpointing_enable", "gradient_checkpointing_enable")
    )


def runs_ulysses(model: torch.nn.Module) -> bool:
    """Whether all_to_all sequence parallelism (tensor_parallel/ulysses.py) runs this
    model's class: megalith.models' GPT and Llama, transformers' Llama family and GPT-2.
    The planner checks the heads and the sequence against each sp size itself."""
    from megalith.tensor_parallel.ulysses import validate_ulysses

    try:
        validate_ulysses(model, 1)
    except ValueError:
        return False
    return True


def fingerprint(model: torch.nn.Module, settings: dict[str, Any]) -> str:
    """A hash of the model's parameter names, shapes and dtypes, and of the settings."""
    h = hashlib.sha256(repr(sorted(settings.items())).encode())
    for name, p in model.named_parameters():
        h.update(f"{name}:{tuple(p.shape)}:{p.dtype}:{p.requires_grad};".encode())
    return h.hexdigest()[:16]


def agree(model: torch.nn.Module, settings: dict[str, Any], make_plan: Any) -> AutoPlan:
    """Collective: rank 0's make_plan(), on every rank; an error there raises everywhere."""
    import torch.distributed as dist

    import megalith_comm as comm

    w = comm.get_world()
    if w.world_size == 1:
        return make_plan()
    prints: list[Any] = [None] * w.world_size
    dist.all_gather_object(prints, fingerprint(model, settings))
    odd = [r for r, f in enumerate(prints) if f != prints[0]]
    if odd:
        raise ValueError(
            f"AutoPlugin: rank(s) {odd} were given another model or other AutoPlugin "
            "arguments than rank 0 (parameter names, shapes, dtypes or settings differ); "
            "build the same model with the same arguments on every rank"
        )
    box: list[Any] = [None]
    if w.rank == 0:
        try:
            box[0] = ("ok", make_plan())
        except Exception as e:  # every rank raises it, none waits for a plan
            box[0] = ("error", type(e).__name__, str(e))
    dist.broadcast_object_list(box, src=0)
    if box[0][0] == "ok":
        return box[0][1]
    _, kind, message = box[0]
    from megalith.autoparallel.search import NoFeasiblePlan

    error = {"NoFeasiblePlan": NoFeasiblePlan, "TypeError": TypeError}.get(kind, ValueError)
    raise error(message if w.rank == 0 else f"{message} (planned on rank 0)")


def strategy_of(candidate: Any, precision: str, max_norm: float) -> Strategy:
    """The Strategy that runs `candidate` (activation checkpointing aside: the plugin's)."""
    offload = None
    if candidate.offload != "none":
        if candidate.offload != "host":
            raise ValueError(
                f"AutoPlugin: the plan offloads to {candidate.offload!r}, which AutoPlugin does "
                "not build yet; pass allow_offload=False or constrain offload='host'"
            )
        from megalith_offload import OffloadConfig

        offload = OffloadConfig(tier="host", optim_frac=candidate.offload_fraction)
    plugin = candidate.plugin
    if plugin != "hybrid":
        return Strategy(plugin=plugin, precision=precision, offload=offload, max_norm=max_norm)
    style, chunks = PP_STYLE.get(candidate.schedule, ("1f1b", 1))
    pipelined = candidate.pp > 1
    parallel = Parallel(
        tp=candidate.tp,
        pp=candidate.pp,
        sp=candidate.sp,
        sequence_parallelism="all_to_all" if candidate.sp > 1 else None,
        pp_style=style,
        num_model_chunks=chunks if pipelined else 1,
        num_microbatches=candidate.num_microbatches if pipelined else None,
    )
    return Strategy(
        plugin="hybrid",
        zero_stage=candidate.zero_stage,
        precision=precision,
        parallel=parallel,
        offload=offload,
        max_norm=max_norm,
    )
