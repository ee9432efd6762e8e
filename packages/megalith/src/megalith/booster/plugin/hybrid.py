"""HybridParallelPlugin: tensor (and sequence) parallelism composed with data parallelism.

ColossalAI's argument names where they mean the same. What runs today: tp_size
any divisor of the world size, pp_size >= 1 (pp_style "1f1b", "interleaved",
"zbv"; hybrid_pipeline.py), zero_stage 0, 1 or 2 (under a pipeline too: ZeRO-2
reduce-scatters once per step, after the last micro-batch), precision fp32, bf16
or fp16, enable_sequence_parallelism with sequence_parallelism_mode="split_gather"
(over the tp group) or "all_to_all" (Ulysses over an sp axis of its own, sp_size
>= 2, beside any tp_size and pp_size; megalith.models, transformers' Llama and GPT-2),
custom_policy (and the task heads of transformers' GPT-2, Llama, BERT and T5 models, for tp
and for pp: tensor_parallel/policies), parallel_output (True, ColossalAI's default: a causal
LM's logits stay vocabulary-parallel and its loss is computed on the shards; False: full
logits on every tp rank), gradient_checkpoint_config (checkpointing.py:
True, a ratio, or ColossalAI's GradientCheckpointConfig(gradient_checkpointing_ratio)),
cpu_offload (with zero_stage 1 or 2: fp32 masters and optimizer states in host memory,
stepped there by the engine's CPU kernel). Other values fail at construction with
what is missing.

Composition (one place, fixed order):
  1. validate: tp against the world size and, through the policy, against the
     model's heads / vocabulary / widths, on every rank before any collective;
  2. Mesh(dp=world/(sp*tp), sp=sp, tp=tp): tp fastest, so a tensor-parallel group
     is adjacent ranks (on one host, where its per-layer collectives are cheapest);
     sp is 1 except in the all_to_all mode;
  3. shard the model in place (megalith.tensor_parallel.shard_model), then make
     every dp replica start equal (broadcast from dp rank 0), and give every rank
     of a tp group tp rank 0's random state: dropout on activations that are
     replicated over the group must draw the same mask on every rank, or the
     replicas drift apart (the masks of different heads, or sequence shards, are
     then drawn alike: correlated, not wrong); then activation checkpointing on the
     first layers (it wraps whole layers, so it sees the sharded ones);
  4. pp_size > 1: cut the sharded model into stages over the pp axis of
     Mesh(pp, dp, sp, tp) (megalith_pipeline), the optimizer keeps this rank's
     stages, the other stages' tensors are freed (meta: megalith_pipeline's
     free_other_stages), and steps run through booster.execute_pipeline (under
     all_to_all sequence parallelism each stage's layers run on this sp rank's sequence
     shard, which the p2p carries: the split and gather hooks sit on the first and last
     layer of the whole model, and every layer's gradients are all-reduced over sp); a weight
     tied across stages (tie_word_embeddings) has its stages' gradients summed over
     the first and last stage (under ZeRO stage 1 in its reduced gradients);
  5. data parallel over the dp axis: zero_stage 0 averages gradients after
     backward; zero_stage 1 and 2 hand the sharded model to megalith_zero over the
     dp axis of the same mesh (optimizer states sharded; gradients all-reduced at
     stage 1, reduce-scattered at stage 2). ZeRO's chunks hold this rank's tp
     shards, so its dp shards are shards of shards.

Clipping (max_norm) and fp16 loss scaling span the whole model at every zero_stage:
the norm is the unsharded model's (tp shards summed, a tp-replicated parameter and a
weight tied across stages counted once, every stage added), and an fp16 inf/nan on any
rank skips the step on every rank (the flag is reduced over dp, tp and pp), so replicas
never disagree. zero_stage 0 does it here (tp_grad_norm_sq, HybridOptimizer); ZeRO does
it in megalith_zero, told about the tp/pp ranks by megalith_zero.ModelParallel.
fp16 is torch.autocast at zero_stage 0 and under a pipeline (fp32 parameters; the
pipeline scales each micro-batch's loss) and fp16 working parameters under ZeRO without
a pipeline (fp32 masters), all with the dynamic loss scale of initial_scale, ...
(ColossalAI's arguments; megalith_zero's DynamicLossScaler).

Checkpoints (Booster.save_model / save_optimizer) are layout-free at every
zero_stage: full, unsharded tensors and optimizer states keyed by parameter name,
gathered over tp (and dp under ZeRO) and written by rank 0 one parameter at a
time (see checkpoint_io/hybrid.py and tp_layout.py); they load under any tp size or
plugin. With pp_size > 1 the files are the same: rank 0 collects the stages over pp
(checkpoint_io/pipeline_stages.py), a weight tied across stages written once, so a pipelined run
resumes under another tp x pp x dp layout, without a pipeline, or under DDP.

ColossalAI's attributes: stage_manager, pg_mesh, dp_group / tp_group / pp_group / sp_group
(torch.distributed groups; hybrid_mesh.py), dp_size ... sp_size, shard_config. Every
ColossalAI argument is accepted; hybrid_args.py says which are honoured, which only tune
speed and which are refused. The boosted optimizer: hybrid_optimizer.py.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from megalith.strategy import Parallel, Strategy, colossal_loss_scale

from ..wrappers import ModelWrapper
from .base import StrategyPlugin, check_precision, require, world
from .checkpointing import apply_checkpointing, checkpoint_config
from .hybrid_args import (
    SPEED_ONLY,
    check_communication_dtype,
    check_speed_only,
    refuse_fp8,
    sequence_settings,
)
from .hybrid_mesh import PipelineStageManager, ProcessGroupMesh, singleton_groups
from .hybrid_optimizer import HybridOptimizer, PipelineOptimizer, tp_grad_norm_sq
from .hybrid_pipeline import PipelineModel, PipelineSettings, stage_balance
from .param_states import follow_params, keep_states_of
from .pp_plugin_base import PipelinePluginBase

if TYPE_CHECKING:
    from ..checkpoint_io import CheckpointIO

_DTYPE = {"bf16": torch.bfloat16, "fp16": torch.float16}


class HybridModel(ModelWrapper):
    def __init__(
        self, module: torch.nn.Module, precision: str, mesh: Any, broadcast_buffers: bool = False
    ) -> None:
        super().__init__(module)
        self.precision = precision
        self.mesh = mesh
        self.broadcast_buffers = broadcast_buffers

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        if self.broadcast_buffers and self.module.training:  # as DDP: dp rank 0's buffers
            _broadcast(self.module.buffers(), self.mesh.group("dp"))
        if self.precision == "fp32":
            return self.module(*args, **kwargs)
        device = next(self.module.parameters()).device.type
        with torch.autocast(device_type=device, dtype=_DTYPE[self.precision]):
            return self.module(*args, **kwargs)


@dataclass(frozen=True)
class ShardConfig:
    """ColossalAI's shard_config, as far as megalith has its settings."""

    tensor_parallel_process_group: Any
    sequence_parallel_process_group: Any
    pipeline_stage_manager: Any
    enable_tensor_parallelism: bool
    enable_sequence_parallelism: bool
    sequence_parallelism_mode: str | None
    parallel_output: bool
    gradient_checkpoint_config: Any

    @property
    def tensor_parallel_size(self) -> int:
        import torch.distributed as dist

        return dist.get_world_size(self.tensor_parallel_process_group)


class HybridParallelPlugin(StrategyPlugin, PipelinePluginBase):
    runs = ("hybrid",)

    def __init__(
        self,
        tp_size: int,
        pp_size: int = 1,
        sp_size: int | None = None,
        precision: str = "fp32",
        zero_stage: int = 0,
        enable_all_optimization: bool = False,
        enable_fused_normalization: bool = False,
        enable_flash_attention: bool = False,
        enable_jit_fused: bool = False,
        enable_sequence_parallelism: bool = False,
        sequence_parallelism_mode: str | None = None,
        enable_sequence_overlap: bool = False,
        parallel_output: bool = True,
        num_microbatches: int | None = None,
        microbatch_size: int | None = None,
        initial_scale: float = 2**16,
        min_scale: float = 1,
        growth_factor: float = 2,
        backoff_factor: float = 0.5,
        growth_interval: int = 1000,
        hysteresis: int = 2,
        max_scale: float = 2**32,
        max_norm: float = 0.0,
        broadcast_buffers: bool = True,
        ddp_bucket_cap_mb: int = 25,
        find_unused_parameters: bool = False,
        check_reduction: bool = False,
        gradient_as_bucket_view: bool = False,
        static_graph: bool = False,
        zero_bucket_size_in_m: int = 12,
        cpu_offload: bool = False,
        communication_dtype: torch.dtype | None = None,
        overlap_communication: bool = True,
        custom_policy: Any = None,
        pp_style: str = "1f1b",
        num_model_chunks: int = 1,
        scheduler_nodes: list | None = None,
        num_layers_per_stage: list[int] | None = None,
        gradient_checkpoint_config: Any = None,
        enable_metadata_cache: bool = True,
        make_vocab_size_divisible_by: int = 64,
        dp_outside: bool = True,
        overlap_p2p: bool = True,
        overlap_allgather: bool = False,
        fp8_communication: bool = False,
        use_fp8: bool = False,
        inner_ring_size: int | None = None,
    ) -> None:
        """ColossalAI's arguments (hybrid_args.py has the table of what each does here).
        precision defaults to fp32 (ColossalAI: fp16)."""
        if not isinstance(tp_size, int) or tp_size < 1:
            raise ValueError(f"HybridParallelPlugin: tp_size must be an int >= 1, got {tp_size!r}")
        speed = {k: v for k, v in locals().items() if k in SPEED_ONLY}
        check_speed_only(speed)
        refuse_fp8(fp8_communication, use_fp8)
        PipelineSettings.check(
            pp_size, pp_style, num_model_chunks, num_microbatches, microbatch_size
        )
        seq = sequence_settings(
            enable_sequence_parallelism, sequence_parallelism_mode, sp_size, tp_size
        )
        if zero_stage not in (0, 1, 2):
            raise ValueError(
                f"HybridParallelPlugin: zero_stage={zero_stage}; 0, 1 or 2 (stage 3 with "
                "tensor parallelism is not built yet: GeminiPlugin runs stage 3 without tp)"
            )
        if cpu_offload and zero_stage not in (1, 2):
            raise ValueError(
                f"HybridParallelPlugin: cpu_offload=True with zero_stage={zero_stage}; "
                "cpu_offload moves ZeRO's fp32 masters and optimizer states to host memory: "
                "set zero_stage=1 or 2"
            )
        self._default_options()
        self.communication_dtype = check_communication_dtype(
            communication_dtype, zero_stage, pp_size
        )
        self.checkpointing = checkpoint_config(gradient_checkpoint_config)
        self.gradient_checkpoint_config = gradient_checkpoint_config
        self.custom_policy = custom_policy
        self.parallel_output = bool(parallel_output)
        self.broadcast_buffers = bool(broadcast_buffers)
        self.num_layers_per_stage = list(num_layers_per_stage) if num_layers_per_stage else None
        self.enable_sequence_parallelism = enable_sequence_parallelism
        offload = None
        if cpu_offload:
            mo = require(
                "megalith_offload", "megalith-offload", "HybridParallelPlugin(cpu_offload)"
            )
            offload = mo.OffloadConfig(tier="host", optim_frac=1.0)
        parallel = Parallel(
            tp=tp_size, pp=pp_size, sp=seq.sp, sequence_parallelism=seq.mode, pp_style=pp_style,
            num_model_chunks=num_model_chunks, num_microbatches=num_microbatches,
            microbatch_size=microbatch_size,
        )  # fmt: skip
        super().__init__(
            Strategy(
                plugin="hybrid",
                zero_stage=zero_stage,
                precision=check_precision("HybridParallelPlugin", precision),
                parallel=parallel,
                offload=offload,
                loss_scale=colossal_loss_scale(
                    initial_scale=initial_scale,
                    min_scale=min_scale,
                    growth_factor=growth_factor,
                    backoff_factor=backoff_factor,
                    growth_interval=growth_interval,
                    hysteresis=hysteresis,
                    max_scale=max_scale,
                ),
                max_norm=max_norm,
            )
        )
        import megalith_comm as comm

        if comm.is_initialized():  # ColossalAI makes its groups here; megalith too when it can
            self._build_mesh()

    def _default_options(self) -> None:
        self.checkpointing = None
        self.gradient_checkpoint_config = None
        self.custom_policy = None
        self.mesh: Any = None
        self._pg_mesh: ProcessGroupMesh | None = None
        self._stage_manager: PipelineStageManager | None = None
        self.parallel_output = True
        self.broadcast_buffers = True
        self.communication_dtype = None
        self.num_layers_per_stage = None
        self.enable_sequence_parallelism = False

    # -- the mesh, and ColossalAI's view of it -------------------------------------------
    def _shard_experts(self, model: torch.nn.Module) -> None:
        """MoeHybridParallelPlugin splits a model's experts over its ep ranks here."""

    def _build_mesh(self) -> None:
        """megalith_comm's Mesh (pp, dp, sp, tp; tp fastest) and the torch groups of its
        axes; collective over the world, so every rank makes the plugin alike."""
        import megalith_comm as comm

        if self.mesh is not None:
            return
        w = world()
        dp = self._dp()
        if self.pp_size > 1:
            mesh = comm.Mesh(
                w, pp=self.pp_size, dp=dp, sp=self.sp_size, tp=self.tp_size, name="hybrid"
            )
        else:
            mesh = comm.Mesh(w, dp=dp, sp=self.sp_size, tp=self.tp_size, name="hybrid")
        self._pg_mesh = ProcessGroupMesh(mesh, singleton_groups())
        if self.pp_size > 1:
            s = self.pipeline
            self._stage_manager = PipelineStageManager(mesh, self._pg_mesh, s.schedule, s.chunks)
        self.mesh = mesh

    @property
    def pg_mesh(self) -> ProcessGroupMesh:
        self._build_mesh()
        return self._pg_mesh  # type: ignore[return-value]

    @property
    def stage_manager(self) -> PipelineStageManager | None:
        """ColossalAI's PipelineStageManager; None when pp_size == 1."""
        if self.pp_size == 1:
            return None
        self._build_mesh()
        return self._stage_manager

    dp_axis, pp_axis, tp_axis, sp_axis = 0, 1, 2, 3

    @property
    def dp_group(self) -> Any:
        return self.pg_mesh.get_group_along_axis("dp")

    @property
    def tp_group(self) -> Any:
        return self.pg_mesh.get_group_along_axis("tp")

    @property
    def pp_group(self) -> Any:
        return self.pg_mesh.get_group_along_axis("pp")

    @property
    def sp_group(self) -> Any:
        """split_gather runs over the tp group (ColossalAI's rule); all_to_all over sp."""
        return self.tp_group if self.sequence_parallel else self.pg_mesh.get_group_along_axis("sp")

    @property
    def mixed_dp_group(self) -> Any:
        return self.pg_mesh.get_group_along_axis(("dp", "sp"))

    @property
    def shard_config(self) -> ShardConfig:
        return ShardConfig(
            tensor_parallel_process_group=self.tp_group,
            sequence_parallel_process_group=self.sp_group,
            pipeline_stage_manager=self.stage_manager,
            enable_tensor_parallelism=self.tp_size > 1,
            enable_sequence_parallelism=self.sp_mode is not None,
            sequence_parallelism_mode=self.sp_mode,
            parallel_output=self.parallel_output,
            gradient_checkpoint_config=self.gradient_checkpoint_config,
        )

    # -- ColossalAI's Plugin interface ---------------------------------------------------
    @property
    def enable_pipeline_parallelism(self) -> bool:
        return self.pp_size > 1

    def supported_devices(self) -> list[str]:
        return ["cuda", "npu", "cpu"]

    def supported_precisions(self) -> tuple[str, ...]:
        return ("fp32", "bf16", "fp16")

    def control_device(self) -> bool:
        return True

    def control_precision(self) -> bool:
        return True

    def support_no_sync(self) -> bool:
        return True

    def support_lora(self) -> bool:
        """peft LoRA adapters split as their base layers are (tensor_parallel/lora.py), on
        their own pipeline stage; only the adapters step."""
        return True

    def control_checkpoint_io(self) -> bool:
        return True

    def materializes_into_shards(self) -> bool:
        """boost() leaves a LazyInitContext model lazy for this plugin, which materialises
        it straight into its tp shards (megalith.lazy.tp_shards); at tp 1 it is whole."""
        return self.tp_size > 1

    # The Strategy's settings under the names the rest of the plugin reads.
    @property
    def tp_size(self) -> int:
        return self.strategy.parallel.tp

    @property
    def pp_size(self) -> int:
        return self.strategy.parallel.pp

    @property
    def sp_size(self) -> int:
        return self.strategy.parallel.sp

    @property
    def dp_size(self) -> int:
        return self._dp()

    @property
    def sp_mode(self) -> str | None:
        return self.strategy.parallel.sequence_parallelism

    @property
    def sequence_parallelism_mode(self) -> str | None:
        return self.sp_mode

    @property
    def sequence_parallel(self) -> bool:
        return self.sp_mode == "split_gather"

    @property
    def zero_stage(self) -> int:
        return self.strategy.zero_stage

    @property
    def cpu_offload(self) -> bool:
        return self.strategy.offload is not None

    @property
    def pipeline(self) -> PipelineSettings:
        return self.strategy.parallel.pipeline_settings()

    def _scaler(self) -> Any:
        """fp16 at zero_stage 0: megalith_zero's dynamic loss scaler; None otherwise."""
        if self.precision != "fp16":
            return None
        zero = require("megalith_zero", "megalith-zero", "HybridParallelPlugin(precision='fp16')")
        return zero.DynamicLossScaler(self.strategy.loss_scale)

    def _model_parallel(self, zero: Any, pipe: Any = None) -> Any:
        """megalith_zero's view of the rest of this dp replica (tp shards, pp stages): a
        tp shard counts on its rank, a tp-replicated parameter on tp rank 0 only, the
        secondary copy of a weight tied across stages nowhere. None without tp and pp."""
        axes = tuple(a for a, n in (("pp", self.pp_size), ("tp", self.tp_size)) if n > 1)
        if not axes:
            return None
        first_tp = self.mesh.coord("tp") == 0
        secondary = {id(p) for p in pipe.tied.secondary_copies()} if pipe is not None else set()

        def weight(p: torch.nn.Parameter) -> float:
            if id(p) in secondary:
                return 0.0
            return 1.0 if first_tp or hasattr(p, "tp_spec") else 0.0

        return zero.ModelParallel(self.mesh.group(axes), weight)

    def _dp(self) -> int:
        return self.strategy.dp_size(world().world_size)

    @property
    def dp_rank_size(self) -> tuple[int, int]:
        dp = self._dp()
        # mesh order (pp, dp, sp, tp): tp fastest
        return world().rank // (self.tp_size * self.sp_size) % dp, dp

    def _policy(self, model: torch.nn.Module) -> Any:
        """The tensor-parallel policy (needed for tp, and for pp to cut transformers
        models into stages) of the model, or of a peft model's base model; None for a
        model no policy knows, under pp only."""
        from megalith.tensor_parallel import policy_for
        from megalith.tensor_parallel.lora import peft_base

        model = peft_base(model)

        if self.custom_policy is not None:
            return self.custom_policy
        if self.tp_size > 1:
            return policy_for(model)
        if self.pp_size > 1:
            try:
                return policy_for(model)
            except ValueError:
                return None  # megalith_pipeline cuts it by its own rules
        return None

    def configure(self, model, optimizer, criterion, dataloader, lr_scheduler):
        import megalith_comm as comm
        from megalith.lazy import is_lazy
        from megalith.lazy.tp_shards import shard_lazily
        from megalith.tensor_parallel import apply_ulysses, install_parallel_loss, shard_model
        from megalith.tensor_parallel.lora import peft_base, shard_with_adapters
        from megalith.tensor_parallel.ulysses import validate_ulysses

        w = world()
        policy = self._policy(model)
        base = peft_base(model)  # what the policy shards and cuts (model itself without peft)
        if self.tp_size > 1:
            policy.validate(base, self.tp_size)  # before the mesh's collectives
        if self.sp_mode == "all_to_all":
            validate_ulysses(base, self.sp_size, self.tp_size)
        # a LazyInitContext model is materialised straight into its tp shards
        lazy = self.materializes_into_shards() and is_lazy(model)
        if not lazy:
            model = model.to(w.device)
        before = {id(p): name for name, p in model.named_parameters()}
        self._build_mesh()
        parallel_logits = False
        if self.tp_size > 1:
            parallel_logits = self.parallel_output and policy.has_lm_head(base)
            tp, sp = self.mesh.group("tp"), self.sequence_parallel

            def shard() -> None:
                shard_model(base, tp, sequence_parallel=sp, gather_logits=not parallel_logits,
                            policy=policy)  # fmt: skip

            def shard_all() -> None:  # peft adapters split as their layers
                shard_with_adapters(base, tp, shard)

            if lazy:
                shard_lazily(model, w.device, shard_all)
                model = model.to(w.device)
            else:
                shard_all()
            if parallel_logits:
                install_parallel_loss(base, tp)
        if self.sp_mode == "all_to_all":  # a peft model's adapters stay in its layers
            apply_ulysses(base, self.mesh.group("sp"))
        self._shard_experts(base)
        if self.checkpointing is not None:
            apply_checkpointing(model, self.checkpointing)
        # an optimizer that has stepped: its states follow the tp shards (param_states.py)
        _replace_params(optimizer, model, before, self.mesh.group("tp"))
        dp_group = self.mesh.group("dp")
        with torch.no_grad():
            for p in model.parameters():  # an expert weight: over the ranks holding its experts
                group = getattr(p, "moe_dp_group", dp_group)
                comm.broadcast(p.data, src=group.global_rank(0), group=group)
            if self.broadcast_buffers:
                _broadcast(model.buffers(), dp_group)
        _share_rng(self.mesh.group("tp"))
        if self.pp_size > 1:
            logits_group = self.mesh.group("tp") if parallel_logits else None
            return self._pipeline(
                model, optimizer, criterion, dataloader, lr_scheduler, policy, logits_group
            )
        if self.zero_stage in (1, 2):
            return self._zero(model, optimizer, criterion, dataloader, lr_scheduler)
        sync_buffers = (
            self.broadcast_buffers and dp_group.size > 1 and any(True for _ in model.buffers())
        )
        wrapped = HybridModel(model, self.precision, self.mesh, sync_buffers)
        opt = None
        if optimizer:
            opt = HybridOptimizer(
                optimizer, wrapped, self.max_norm, self._scaler(), self.communication_dtype
            )
        return wrapped, opt, criterion, dataloader, lr_scheduler

    def _zero(self, model, optimizer, criterion, dataloader, lr_scheduler):
        stage = self.zero_stage
        what = f"HybridParallelPlugin(zero_stage={stage})"
        zero = require("megalith_zero", "megalith-zero", what)
        from .zero import ZeroModelWrapper, ZeroOptimizerWrapper

        if optimizer is None:
            raise ValueError(f"{what}: boost() needs the optimizer")
        zmodel, zopt = zero.shard(
            model, optimizer, self.strategy.zero_config(), mesh=self.mesh, axis="dp",
            model_parallel=self._model_parallel(zero),
        )  # fmt: skip
        wrapped = ZeroModelWrapper(zmodel)
        return (
            wrapped,
            ZeroOptimizerWrapper(zopt, wrapped, self.max_norm, False),
            criterion,
            dataloader,
            lr_scheduler,
        )

    def _pipeline(
        self, model, optimizer, criterion, dataloader, lr_scheduler, policy, logits_group
    ):
        """Steps 4 and 5 for pp_size > 1: cut the (tp-sharded) model into stages over the
        pp axis (a policy's pipeline_parts for transformers models, task heads included);
        the optimizer keeps this rank's stages' parameters only; then ZeRO over dp."""
        pipeline = require(
            "megalith_pipeline", "megalith-pipeline", "HybridParallelPlugin(pp_size>1)"
        )
        settings = self.pipeline
        from megalith.tensor_parallel.lora import peft_base

        parts = policy.pipeline_parts(peft_base(model)) if policy is not None else None
        source = pipeline.PipelineParts(*parts) if parts is not None else model
        balance: Any = "layers"
        if self.num_layers_per_stage is not None:
            layers = len(pipeline.as_layers(source))
            balance = stage_balance(self.num_layers_per_stage, layers)
        pipe = pipeline.Pipeline(
            source,
            num_microbatches=settings.num_microbatches or 1,
            schedule=settings.schedule,
            chunks=settings.chunks,
            mesh=self.mesh,
            pp_axis="pp",
            dp_axis="dp",
            balance=balance,
            loss_on_all_ranks=True,
        )
        local = {id(p) for p in pipe.module.parameters()}
        if optimizer is not None:
            for group in optimizer.param_groups:
                group["params"] = [p for p in group["params"] if id(p) in local]
            keep_states_of(optimizer, local)
        pipeline.free_other_stages(model, pipe.module)  # this rank holds its stages only
        wrapped = PipelineModel(pipe, settings, self.precision, self.mesh, model)
        wrapped.uses_parts = parts is not None
        wrapped.logits_group = logits_group
        if not self.zero_stage:
            opt = None
            if optimizer:
                opt = PipelineOptimizer(optimizer, wrapped, self.max_norm, self._scaler())
            return wrapped, opt, criterion, dataloader, lr_scheduler
        what = f"HybridParallelPlugin(zero_stage={self.zero_stage})"
        zero = require("megalith_zero", "megalith-zero", what)
        from .zero import ZeroOptimizerWrapper

        if optimizer is None:
            raise ValueError(f"{what}: boost() needs the optimizer")
        # bf16 and fp16 come from autocast here (the Strategy's ZeroConfig under a pipeline:
        # fp32 parameters and masters, fp16 scaling the loss). Stage 2 reduce-scatters once
        # per step: every micro-batch but the last runs under ZeRO's no_sync, which
        # accumulates the full gradients locally.
        config = self.strategy.zero_config()
        if pipe.tied.crosses_ranks:
            config = _tied_zero_config(config, self.strategy.step_in_backward)
        _, zopt = zero.shard(
            pipe.module, optimizer, config, mesh=self.mesh, axis="dp",
            model_parallel=self._model_parallel(zero, pipe),
        )  # fmt: skip
        wrapped.zero_no_sync = zopt.no_sync
        if pipe.tied.crosses_ranks:  # summed over the stages in ZeRO's reduced gradients
            pipe.reduced_grads = zopt.reduced_grads
        zwrapped = ZeroOptimizerWrapper(zopt, wrapped, self.max_norm, False)
        zwrapped.pipeline_model = wrapped  # checkpoint_io: names the stages' states
        return wrapped, zwrapped, criterion, dataloader, lr_scheduler

    def execute_pipeline(
        self,
        data_iter: Any,
        model: Any,
        criterion: Any,
        optimizer: Any = None,
        return_loss: bool = True,
        return_outputs: bool = False,
    ) -> Any:
        """One step: the next batch's forward and backward through every stage. Returns the
        loss (on every rank); with return_outputs the last stage's outputs of the whole batch
        (the model's own output type) are in model.last_outputs on the last stage's ranks."""
        if not isinstance(model, PipelineModel):
            raise ValueError(
                "execute_pipeline: the model must be the one boost() returned with pp_size > 1"
            )
        if not hasattr(data_iter, "__next__"):
            raise TypeError(
                f"execute_pipeline: data_iter must be an iterator (iter(dataloader)), got "
                f"{type(data_iter).__name__}: each step takes its next batch"
            )
        scale = getattr(optimizer, "loss_scale", 1.0) if optimizer is not None else 1.0
        return model.step(
            next(data_iter), criterion, model.zero_no_sync, scale, keep_outputs=return_outputs,
            sum_ties=_accumulation_ends(optimizer),
        )  # fmt: skip

    def local_named_parameters(self, model: Any) -> dict[str, torch.nn.Parameter]:
        """This rank's parameters (its stages, its tp shards) by their names in the model."""
        module = model.whole if isinstance(model, PipelineModel) else model.unwrap()
        local = {id(p) for p in model.unwrap().parameters()}
        return {n: p for n, p in module.named_parameters() if id(p) in local}

    def no_sync(self, model: Any, optimizer: Any) -> contextlib.AbstractContextManager:
        if optimizer is None:
            raise ValueError("HybridParallelPlugin: no_sync needs the boosted optimizer")
        return optimizer.no_sync()

    def get_checkpoint_io(self) -> CheckpointIO:
        """ZeRO without a pipeline: megalith_zero's full checkpoints through tp_layout;
        otherwise tp shards gathered and pipeline stages collected by the Booster."""
        from ..checkpoint_io import HybridParallelCheckpointIO, ZeroCheckpointIO
        from ..checkpoint_io.tp_layout import tp_layout

        if self.zero_stage and self.pp_size == 1:
            return ZeroCheckpointIO(tp_layout if self.tp_size > 1 else None)
        return HybridParallelCheckpointIO()


def _accumulation_ends(optimizer: Any) -> bool:
    """False inside booster.no_sync (gradients accumulate over several execute_pipeline
    calls): a weight tied across stages is summed once, when the window ends."""
    zopt = getattr(optimizer, "zero_optimizer", None)
    if zopt is not None:
        return bool(zopt.reducer.sync)
    return bool(getattr(optimizer, "_sync", True))


def _tied_zero_config(config: Any, step_in_backward: bool | None) -> Any:
    """ZeRO's config when a weight is tied across pipeline stages (an embedding and its LM
    head): its stages' gradients are summed in ZeRO's reduced gradients after backward,
    which stage 1 keeps whole on every rank, so nothing may step during backward (the
    default with cpu_offload, turned off here: it only overlaps the host step)."""
    import dataclasses

    if config.stage != 1:
        raise ValueError(
            f"HybridParallelPlugin: zero_stage={config.stage} with a weight tied across "
            "pipeline stages (tie_word_embeddings): use zero_stage=1, pp_style='zbv' (which "
            "puts the first and last stage on one rank), or untie the weights"
        )
    if step_in_backward:
        raise ValueError(
            "HybridParallelPlugin: step_in_backward=True with a weight tied across pipeline "
            "stages: its stages' gradients are summed after backward; leave it unset"
        )
    return dataclasses.replace(config, step_in_backward=False)


def _broadcast(tensors: Any, group: Any) -> None:
    """dp rank 0's values into every rank's tensors (buffers)."""
    import megalith_comm as comm

    if group.size == 1:
        return
    with torch.no_grad():
        for t in tensors:
            comm.broadcast(t.data, src=group.global_rank(0), group=group)


def _share_rng(group: Any) -> None:
    """Every rank of group takes group rank 0's torch random state (CPU, and CUDA if used)."""
    import megalith_comm as comm

    src = group.global_rank(0)
    state = torch.get_rng_state()
    comm.broadcast(state, src=src, group=group)
    torch.set_rng_state(state)
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        cuda_state = torch.cuda.get_rng_state()
        comm.broadcast(cuda_state, src=src, group=group)
        torch.cuda.set_rng_state(cuda_state)


def _replace_params(
    optimizer: Any, model: torch.nn.Module, before: dict[int, str], tp: Any = None
) -> None:
    """Points the optimizer at the sharded parameters.

    Sharding replaces Parameters (a shard is a new tensor), so the optimizer built on
    the full model is re-pointed, each parameter by its name, which sharding keeps; the
    states of one that has stepped become their tp shards (param_states.py).
    """
    follow_params(optimizer, model, before, tp)


__all__ = [
    "HybridModel",
    "HybridOptimizer",
    "HybridParallelPlugin",
    "PipelineOptimizer",
    "tp_grad_norm_sq",
]
