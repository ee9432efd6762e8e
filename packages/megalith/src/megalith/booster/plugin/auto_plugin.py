"""AutoPlugin (`Booster(plugin="auto")`): the plugin megalith.autoparallel's planner chooses.

    booster = Booster(plugin=AutoPlugin(seq_len=1024, global_batch_tokens=2**19))
    model, optimizer, *_ = booster.boost(model, optimizer)   # plans here, then delegates
    booster.plugin.plan.chosen        # the Candidate it runs; .candidates: the runner-ups
    dp_rank, dp = booster.plugin.dp_rank_size                 # feed this rank's share

At boost() it analyses the model (a meta-device copy: no weight is touched), plans for
the ranks and devices it sees (world size, ranks per node, the machine profile:
auto_plan.py says which), searches dp x tp x pp x sp x ZeRO stage x offload x
micro-batch x checkpointing, builds the winner (TorchDDPPlugin, LowLevelZeroPlugin
stage 1/2, GeminiPlugin, each with its offloaded share, or HybridParallelPlugin with
tp / pp / sp and offload) and from then on every call (boost, checkpoint IO, no_sync,
prepare_dataloader, execute_pipeline, dp_rank_size, ...) goes to that plugin. Rank 0
plans and logs the choice and its prediction; every rank runs the same plan.

The batch. The plan is for one optimizer step of a fixed global batch; each
data-parallel rank (booster.plugin.dp_rank_size) feeds `plan.per_rank_sequences` of it
per step, in one forward when pp = 1 (the loop does no gradient accumulation) or split
into the plan's micro-batches by booster.execute_pipeline when pp > 1. The global batch
is, in order: global_batch_tokens; else a dataloader given to boost() (batch_size B over
R replicas: its DistributedSampler's num_replicas, else the world size; this fixes dp =
R); else micro_batch_size x world size sequences.

The plan assumes an Adam-like optimizer (two fp32 states per parameter).
"""

from __future__ import annotations

import contextlib
import os
from typing import TYPE_CHECKING, Any

import torch

from .auto_plan import (
    AutoPlan,
    agree,
    checkpointable,
    choose_profile,
    live_cluster,
    runs_ulysses,
    strategy_of,
)
from .base import Plugin, check_precision, world

if TYPE_CHECKING:
    from ..checkpoint_io import CheckpointIO


class AutoPlugin(Plugin):
    """The plugin the planner chooses at boost() (module docstring).

    seq_len: tokens per sequence (default: the last dimension of the first sample of a
        dataloader given to boost() (a tensor, a tuple's first tensor or a dict's
        input_ids), else the model config's max_seq_len / n_positions /
        max_position_embeddings).
    global_batch_tokens: tokens of one optimizer step over all ranks.
    micro_batch_size: sequences in one forward on a rank (fixes the plan's micro-batch).
    precision: "fp32", "bf16" or "fp16"; None: the Booster's mixed_precision, else bf16 on
        GPUs and fp32 on CPU ranks.
    profile: a MachineProfile, a built-in name or a profile file (default: auto_plan.py).
    cluster: a Cluster or cluster file for the job's ranks (default: the ranks it sees,
        LOCAL_WORLD_SIZE per node).
    max_tp, max_pp: the largest tensor / pipeline sizes tried (None: any). max_pp is 1
        by default: a pipeline needs a loop that steps through booster.execute_pipeline.
    allow_sp: try all_to_all sequence parallelism (on the models Ulysses runs:
        megalith.models' GPT and Llama, transformers' Llama family and GPT-2).
    allow_offload: try offloading optimizer state to host memory.
    allow_ckpt: try activation checkpointing (models with a checkpointing switch only).
    device_budget_gb, host_budget_gb: the memory per device / per node planned for
        (default: the profile's); memory_headroom: the share of it a plan may fill.
    max_norm: clip gradients to this global norm (0: off).
    constraints: any knob of megalith.autoparallel.space.KNOBS fixed to a value or a tuple.
    top: how many candidates to keep (the chosen one and the runner-ups).
    """

    def __init__(
        self,
        *,
        seq_len: int | None = None,
        global_batch_tokens: int | None = None,
        micro_batch_size: int | None = None,
        precision: str | None = None,
        profile: Any = None,
        cluster: Any = None,
        max_tp: int | None = None,
        max_pp: int | None = 1,
        allow_sp: bool = True,
        allow_offload: bool = True,
        allow_ckpt: bool = True,
        device_budget_gb: float | None = None,
        host_budget_gb: float | None = None,
        memory_headroom: float = 0.9,
        max_norm: float = 0.0,
        constraints: dict[str, Any] | None = None,
        top: int = 5,
    ) -> None:
        from megalith.autoparallel import space

        for name, value in (
            ("seq_len", seq_len),
            ("global_batch_tokens", global_batch_tokens),
            ("micro_batch_size", micro_batch_size),
            ("max_tp", max_tp),
            ("max_pp", max_pp),
            ("top", top),
        ):
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, int) or value < 1
            ):
                raise ValueError(f"AutoPlugin: {name}={value!r}; expected an int >= 1 (or None)")
        if not 0.0 < memory_headroom <= 1.0:
            raise ValueError(
                f"AutoPlugin: memory_headroom={memory_headroom}; the share of the device a "
                "plan may fill, in (0, 1]"
            )
        unknown = sorted(set(constraints or {}) - set(space.KNOBS))
        if unknown:
            raise TypeError(
                f"AutoPlugin: unknown constraint(s) {', '.join(unknown)}; the knobs are "
                + ", ".join(space.KNOBS)
            )
        self._precision = None if precision is None else check_precision("AutoPlugin", precision)
        self.settings = {
            "seq_len": seq_len,
            "global_batch_tokens": global_batch_tokens,
            "micro_batch_size": micro_batch_size,
            "max_tp": max_tp,
            "max_pp": max_pp,
            "allow_sp": allow_sp,
            "allow_offload": allow_offload,
            "allow_ckpt": allow_ckpt,
            "device_budget_gb": device_budget_gb,
            "host_budget_gb": host_budget_gb,
            "memory_headroom": memory_headroom,
            "max_norm": max_norm,
            "top": top,
        }
        self.profile = profile
        self.cluster = cluster
        self.constraints = dict(constraints or {})
        self._plan: AutoPlan | None = None
        self._chosen: Plugin | None = None

    # -- the plan -------------------------------------------------------------------
    @property
    def plan(self) -> AutoPlan:
        """The chosen Candidate (.chosen) and the runner-ups (.candidates)."""
        if self._plan is None:
            raise RuntimeError(
                "AutoPlugin.plan: nothing is planned yet; call booster.boost(model, ...) (or "
                "plugin.plan_for(model)) first"
            )
        return self._plan

    @property
    def chosen(self) -> Plugin:
        """The plugin that runs the plan."""
        if self._chosen is None:
            raise RuntimeError(
                "AutoPlugin: no plugin is chosen yet; call booster.boost(model, ...) (or "
                "plugin.plan_for(model)) first: AutoPlugin plans there"
            )
        return self._chosen

    def plan_for(self, model: torch.nn.Module, dataloader: Any = None) -> AutoPlan:
        """Collective: plans for `model` and builds the chosen plugin (boost() does it if
        this was not called); idempotent."""
        if self._plan is not None:
            return self._plan
        w = world()
        device = w.device.type
        precision = self._precision or ("bf16" if device == "cuda" else "fp32")
        settings = {**self.settings, "precision": precision, "profile": str(self.profile)}
        settings["constraints"] = repr(sorted(self.constraints.items()))
        plan = agree(model, settings, lambda: self._search(model, dataloader, precision))
        self._plan = plan
        self._chosen = self._build(plan)
        from megalith.logging import get_dist_logger

        lines = [f"AutoPlugin: {plan.summary()}", *plan.chosen.reason.splitlines()]
        get_dist_logger().info("\n  ".join(lines), ranks=[0])
        return plan

    def _search(self, model: torch.nn.Module, dataloader: Any, precision: str) -> AutoPlan:
        from megalith.autoparallel.analysis import DTYPES, analyze, meta_copy

        s = self.settings
        w = world()
        profile = choose_profile(w.device.type, self.profile)
        if precision not in profile.matmul:
            raise ValueError(
                f"AutoPlugin: profile {profile.name!r} has no {precision} matmul figures "
                f"(it has {', '.join(sorted(profile.matmul))}); pass precision= one of those, "
                "or calibrate this machine in that precision with `megalith calibrate`"
            )
        local = int(os.environ.get("LOCAL_WORLD_SIZE", w.world_size))
        cluster = live_cluster(
            profile, w.world_size, local, self.cluster, s["device_budget_gb"], s["host_budget_gb"]
        )
        seq_len = s["seq_len"] or _sample_seq_len(dataloader) or _config_seq_len(model)
        fixed = self._fixed(model, cluster.world)
        tokens = self._global_tokens(dataloader, seq_len, cluster.world, fixed)
        try:
            analysis = analyze(model, seq_len, precision=precision)
        except (ValueError, TypeError, RuntimeError, NotImplementedError) as e:
            raise ValueError(
                f"AutoPlugin: cannot analyse {type(model).__name__} ({e}); choose a plugin by "
                "hand (Booster(plugin=...)) for this model"
            ) from e
        ranked = _ranked(
            analysis, cluster, tokens, precision, s, fixed, meta_copy(model, DTYPES[precision])
        )
        return AutoPlan(
            chosen=ranked[0],
            candidates=tuple(ranked[1:]),
            profile=profile.name,
            world=cluster.world,
            seq_len=seq_len,
            global_batch_tokens=tokens,
            precision=precision,
        )

    def _fixed(self, model: torch.nn.Module, world_size: int) -> dict[str, Any]:
        """The search's constraints from the arguments and the model."""
        from megalith.autoparallel.space import divisors

        s = self.settings
        fixed = dict(self.constraints)
        if s["max_tp"] is not None:
            fixed["tp"] = _within(
                fixed.get("tp"), [d for d in divisors(world_size) if d <= s["max_tp"]]
            )
        if s["max_pp"] is not None:
            fixed["pp"] = _within(
                fixed.get("pp"), [d for d in divisors(world_size) if d <= s["max_pp"]]
            )
        if not s["allow_sp"] or not runs_ulysses(model):
            fixed["sp"] = 1
        if not s["allow_offload"]:
            fixed["offload"] = "none"
        if not s["allow_ckpt"] or not checkpointable(model):
            fixed["ckpt"] = 0.0
        if s["micro_batch_size"] is not None:
            fixed["micro_batch"] = s["micro_batch_size"]
        return fixed

    def _global_tokens(
        self, dataloader: Any, seq_len: int, world_size: int, fixed: dict[str, Any]
    ) -> int:
        s = self.settings
        batch = getattr(dataloader, "batch_size", None) if dataloader is not None else None
        if batch:
            sampler = getattr(dataloader, "sampler", None)
            replicas = getattr(sampler, "num_replicas", None) or world_size
            fixed["dp"] = replicas
            tokens = batch * replicas * seq_len
            given = s["global_batch_tokens"]
            if given is not None and given != tokens:
                raise ValueError(
                    f"AutoPlugin: global_batch_tokens={given} but the dataloader gives "
                    f"{batch} sequences x {replicas} replicas x {seq_len} tokens = {tokens}; "
                    "leave one of them out"
                )
            return tokens
        if s["global_batch_tokens"] is not None:
            return s["global_batch_tokens"]
        if s["micro_batch_size"] is not None:
            return s["micro_batch_size"] * world_size * seq_len
        raise ValueError(
            "AutoPlugin: the global batch is unknown; pass global_batch_tokens= (tokens of one "
            "step over all ranks) or micro_batch_size=, or give boost() the dataloader"
        )

    def _build(self, plan: AutoPlan) -> Plugin:
        from .checkpointing import checkpoint_config

        strategy = strategy_of(plan.chosen, plan.precision, self.settings["max_norm"])
        plugin = strategy.make_plugin()
        if plan.chosen.ckpt and strategy.plugin == "hybrid":
            plugin.checkpointing = checkpoint_config(plan.chosen.ckpt)
            plugin.gradient_checkpoint_config = plan.chosen.ckpt
        plugin.check()
        return plugin

    # -- the Booster's calls, to the chosen plugin ------------------------------------
    def configure(self, model, optimizer, criterion, dataloader, lr_scheduler):
        plan = self.plan_for(model, dataloader)
        if plan.chosen.ckpt and plan.chosen.plugin != "hybrid":
            from .checkpointing import GradientCheckpointConfig, apply_checkpointing

            apply_checkpointing(model, GradientCheckpointConfig(plan.chosen.ckpt))
        return self.chosen.configure(model, optimizer, criterion, dataloader, lr_scheduler)

    def no_sync(self, model: Any, optimizer: Any) -> contextlib.AbstractContextManager:
        return self.chosen.no_sync(model, optimizer)

    def get_checkpoint_io(self) -> CheckpointIO:
        return self.chosen.get_checkpoint_io()

    def control_precision(self) -> bool:
        # Without its own precision= the Booster's mixed_precision is the plan's (set_precision).
        return self._precision is not None

    def set_precision(self, precision: str | None) -> None:
        if precision is not None:
            self._precision = check_precision("AutoPlugin", precision)

    @property
    def precision(self) -> str:  # type: ignore[override]
        if self._plan is not None:
            return self._plan.precision
        return self._precision or "auto"

    def control_device(self) -> bool:
        return True

    def control_checkpoint_io(self) -> bool:
        return True

    def support_no_sync(self) -> bool:
        return self._chosen is None or self._chosen.support_no_sync()

    def support_lora(self) -> bool:
        return False

    def supported_devices(self) -> list[str]:
        return ["cuda", "cpu"]

    @property
    def dp_rank_size(self) -> tuple[int, int]:
        """(this rank's data-parallel rank, the data-parallel size) of the plan."""
        return self.chosen.dp_rank_size

    @property
    def strategy(self) -> Any:
        """The chosen plugin's megalith.strategy.Strategy."""
        return self.chosen.strategy

    def prepare_dataloader(self, dataset: Any, batch_size: int | None = None, **kwargs: Any) -> Any:
        """The chosen plugin's dataloader over the data-parallel ranks; batch_size None:
        the plan's sequences per data-parallel rank."""
        per_rank = self.plan.per_rank_sequences
        if batch_size is not None and batch_size != per_rank:
            raise ValueError(
                f"AutoPlugin.prepare_dataloader: batch_size={batch_size}, but the plan feeds "
                f"{per_rank} sequences per data-parallel rank; leave batch_size out"
            )
        return self.chosen.prepare_dataloader(dataset, per_rank, **kwargs)

    def __getattr__(self, name: str) -> Any:
        # Only reached for what AutoPlugin does not define: the chosen plugin's attributes
        # (pp_size, stage_manager, execute_pipeline, tp_group, ...).
        if name.startswith("_") or self.__dict__.get("_chosen") is None:
            raise AttributeError(
                f"AutoPlugin has no attribute {name!r} before boost(): it is the chosen "
                "plugin's, known once booster.boost(model, ...) has planned"
            )
        return getattr(self.__dict__["_chosen"], name)


def _within(given: Any, values: list[int]) -> tuple[int, ...]:
    if given is None:
        return tuple(values)
    wanted = set(given) if isinstance(given, (tuple, list, set, frozenset)) else {given}
    return tuple(v for v in values if v in wanted)


def _sample_seq_len(dataloader: Any) -> int | None:
    """The sequence length of the dataloader's first sample (read from its dataset, so no
    batch is drawn and no random state moves), or None."""
    try:
        sample = dataloader.dataset[0]
    except Exception:  # no dataset, not indexable, ...: the other sources decide
        return None
    if isinstance(sample, dict):
        sample = sample.get("input_ids")
    elif isinstance(sample, (tuple, list)) and sample:
        sample = sample[0]
    if isinstance(sample, torch.Tensor) and sample.dim() >= 1 and sample.shape[-1] > 1:
        return int(sample.shape[-1])
    return None


def _config_seq_len(model: torch.nn.Module) -> int:
    config = getattr(model, "config", None)
    for name in ("max_seq_len", "n_positions", "max_position_embeddings"):
        value = getattr(config, name, None)
        if isinstance(value, int) and value > 0:
            return value
    raise ValueError(
        f"AutoPlugin: the sequence length of {type(model).__name__} is unknown; pass seq_len="
    )


def _ranked(
    analysis: Any,
    cluster: Any,
    tokens: int,
    precision: str,
    s: dict[str, Any],
    fixed: dict[str, Any],
    meta: Any,
) -> list[Any]:
    """The best plans. Without a pipeline a step is one forward per rank (the loop
    accumulates nothing): one search per dp size, its micro-batch the rank's whole share;
    pipelines are searched apart, with any number of micro-batches."""
    from megalith.autoparallel.search import NoFeasiblePlan, search
    from megalith.autoparallel.space import allowed, divisors

    seqs = tokens // analysis.seq_len
    pps = allowed(fixed, "pp", divisors(cluster.world))
    runs = []
    if 1 in pps:
        for dp in allowed(fixed, "dp", divisors(cluster.world)):
            if seqs % dp == 0 and allowed(fixed, "micro_batch", [seqs // dp]):
                runs.append({**fixed, "pp": 1, "dp": dp, "micro_batch": seqs // dp})
    if any(p > 1 for p in pps):
        runs.append({**fixed, "pp": tuple(p for p in pps if p > 1)})
    found: list[Any] = []
    first_error: NoFeasiblePlan | None = None
    for constraints in runs:
        try:
            found += search(
                analysis,
                cluster,
                global_batch_tokens=tokens,
                memory_headroom=s["memory_headroom"],
                top=s["top"],
                precision=precision,
                model=meta,
                **constraints,
            )
        except NoFeasiblePlan as e:
            first_error = first_error or e
    found = [c for c in found if c.pp > 1 or c.num_microbatches == 1]
    if not found:
        raise first_error or NoFeasiblePlan(
            f"AutoPlugin: no plan runs {seqs} sequences a step on {cluster.world} ranks in one "
            "forward per rank; give a global batch the data-parallel sizes divide, or allow "
            "a pipeline (max_pp)"
        )
    found.sort(key=lambda c: c.predicted_step_s)
    return found[: s["top"]]
