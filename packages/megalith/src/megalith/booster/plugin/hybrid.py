"""HybridParallelPlugin: tensor (and sequence) parallelism composed with data parallelism.

ColossalAI's argument names where they mean the same. What runs today: tp_size
any divisor of the world size, pp_size >= 1 (pp_style "1f1b", "interleaved",
"zbv"; hybrid_pipeline.py), zero_stage 0, 1 or 2 (under a pipeline too: ZeRO-2
reduce-scatters once per step, after the last micro-batch), precision fp32, bf16
or fp16, enable_sequence_parallelism with sequence_parallelism_mode="split_gather"
(over the tp group) or "all_to_all" (Ulysses over an sp axis of its own, sp_size
>= 2, beside any tp_size; megalith.models only), custom_policy, gradient_checkpoint_config (checkpointing.py:
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
     stages, and steps run through booster.execute_pipeline;
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
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import torch

from megalith.strategy import Parallel, Strategy, colossal_loss_scale

from ..wrappers import ModelWrapper, OptimizerWrapper
from .base import StrategyPlugin, check_precision, require, world
from .checkpointing import apply_checkpointing, checkpoint_config
from .hybrid_pipeline import PipelineModel, PipelineSettings

if TYPE_CHECKING:
    from ..checkpoint_io import CheckpointIO

# ColossalAI's switches that only choose faster kernels or overlap; megalith does each
# where it can without being asked (SDPA picks flash attention, collectives overlap
# backward, p2p shapes are cached), so scripts that pass them run unchanged.
SPEED_HINTS = frozenset(
    {
        "enable_fused_normalization", "enable_flash_attention", "enable_jit_fused",
        "enable_sequence_overlap", "overlap_communication", "overlap_p2p",
        "overlap_allgather", "enable_metadata_cache", "zero_bucket_size_in_m",
        "ddp_bucket_cap_mb",
    }
)  # fmt: skip

_DTYPE = {"bf16": torch.bfloat16, "fp16": torch.float16}


class HybridModel(ModelWrapper):
    def __init__(self, module: torch.nn.Module, precision: str, mesh: Any) -> None:
        super().__init__(module)
        self.precision = precision
        self.mesh = mesh

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        if self.precision == "fp32":
            return self.module(*args, **kwargs)
        device = next(self.module.parameters()).device.type
        with torch.autocast(device_type=device, dtype=_DTYPE[self.precision]):
            return self.module(*args, **kwargs)


def tp_grad_norm_sq(params: list[torch.nn.Parameter], tp_group: Any) -> torch.Tensor:
    """The squared L2 norm (float64) of the gradient of the whole (unsharded) model these
    parameters are part of: shards summed over the tensor-parallel group, replicated
    parameters counted once."""
    import megalith_comm as comm

    sharded = torch.zeros((), dtype=torch.float64)
    replicated = torch.zeros((), dtype=torch.float64)
    for p in params:
        if p.grad is None:
            continue
        sq = p.grad.detach().double().pow(2).sum().cpu()
        if hasattr(p, "tp_spec"):
            sharded += sq
        else:
            replicated += sq
    comm.all_reduce(sharded, group=tp_group)
    return sharded + replicated


class HybridOptimizer(OptimizerWrapper):
    """zero_stage 0: backward, then the dp all-reduce (skipped inside no_sync).

    fp16 (scaler given): backward scales the loss; before clipping or stepping the
    gradients are checked for inf/nan, the flag all-reduced over every rank of the mesh,
    and either every rank skips the step (the scale backs off) or every rank unscales
    and steps."""

    def __init__(
        self,
        optim: torch.optim.Optimizer,
        model: HybridModel,
        max_norm: float,
        scaler: Any = None,
    ):
        super().__init__(optim)
        self.model = model
        self.max_norm = max_norm
        # megalith_zero's DynamicLossScaler, fp16 only (not `scaler`: checkpoint_io reads
        # that name as a torch GradScaler)
        self.loss_scaler = scaler
        self.skipped_steps = 0
        self._found_inf: bool | None = None  # None: gradients not yet checked and unscaled
        self._sync = True
        self._clipped = False

    @property
    def loss_scale(self) -> float:
        return self.loss_scaler.scale if self.loss_scaler is not None else 1.0

    def _unscale(self) -> bool:
        """fp16, once per step: divides the gradients by the loss scale and says whether
        any rank's held an inf/nan (then step() skips everywhere and they are dropped).
        One fused check-and-unscale per device and dtype (GradScaler's kernel), one
        all-reduce of the flag over the whole mesh."""
        import megalith_comm as comm

        if self.loss_scaler is None:
            return False
        if self._found_inf is None:
            by_kind: dict[tuple[torch.device, torch.dtype], list[torch.Tensor]] = {}
            for p in self._params():
                if p.grad is not None:
                    by_kind.setdefault((p.grad.device, p.grad.dtype), []).append(p.grad)
            device = next(iter(by_kind))[0] if by_kind else torch.device("cpu")
            flag = torch.zeros(1, device=device)
            for (dev, _), grads in by_kind.items():
                found = torch.zeros(1, device=dev)
                inv = torch.full((1,), 1.0 / self.loss_scaler.scale, device=dev)
                torch._amp_foreach_non_finite_check_and_unscale_(grads, found, inv)
                flag += found.to(device)
            mesh = self.model.mesh
            comm.all_reduce(flag, op="sum", group=mesh.group(mesh.names))
            self._found_inf = bool(flag.item() > 0)
        return self._found_inf

    def _params(self) -> list[torch.nn.Parameter]:
        return [p for g in self.optim.param_groups for p in g["params"]]

    def backward(self, loss: torch.Tensor, *args: Any, **kwargs: Any) -> None:
        import megalith_comm as comm

        if self.loss_scaler is not None:
            loss = loss * self.loss_scaler.scale
        loss.backward(*args, **kwargs)
        dp = self.model.mesh.group("dp")
        if self._sync and dp.size > 1:
            grads = [p.grad for p in self._params() if p.grad is not None]
            comm.all_reduce_coalesced(grads, op="avg", group=dp)

    def clip_grad_by_norm(self, max_norm: float, norm_type: float = 2.0) -> float:
        if norm_type != 2.0:
            raise ValueError(f"HybridParallelPlugin clips by the L2 norm only, not {norm_type}")
        self._clipped = True
        if self._unscale():  # fp16 overflow somewhere: step() skips on every rank
            return float("inf")
        params = self._params()
        norm = self._grad_norm(params)
        coef = max_norm / (norm + 1e-6)
        if coef < 1.0:
            for p in params:
                if p.grad is not None:
                    p.grad.mul_(coef)
        return norm

    def _grad_norm(self, params: list[torch.nn.Parameter]) -> float:
        return math.sqrt(float(tp_grad_norm_sq(params, self.model.mesh.group("tp"))))

    def step(self, *args: Any, **kwargs: Any) -> Any:
        if self.loss_scaler is not None:
            bad = self._unscale()
            self.loss_scaler.update(bad)  # every rank the same flag, so the same scale
            if bad:
                self.skipped_steps += 1
                self._found_inf, self._clipped = None, False
                return None
        if self.max_norm > 0 and not self._clipped:
            self.clip_grad_by_norm(self.max_norm)
        self._clipped = False
        self._found_inf = None
        return self.optim.step(*args, **kwargs)

    def zero_grad(self, set_to_none: bool = True) -> None:
        self._found_inf = None
        self.optim.zero_grad(set_to_none=set_to_none)

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Gradients accumulate locally; the next backward outside averages the sum."""
        self._sync = False
        try:
            yield
        finally:
            self._sync = True


class PipelineOptimizer(HybridOptimizer):
    """pp_size > 1: the pipeline runs backward (execute_pipeline) and averages over dp;
    clipping spans tp shards and stages."""

    @property
    def pipeline_model(self) -> PipelineModel:
        """checkpoint_io: the stages' whole model names their optimizer states."""
        return self.model

    def backward(self, loss: torch.Tensor, *args: Any, **kwargs: Any) -> None:
        raise RuntimeError(
            "HybridParallelPlugin with pp_size > 1: backward runs inside "
            "booster.execute_pipeline(data_iter, model, criterion, optimizer)"
        )

    def _grad_norm(self, params: list[torch.nn.Parameter]) -> float:
        """Over tp shards and over the stages; a weight tied across stages counted once."""
        import megalith_comm as comm

        skip = {id(p) for p in self.model.pipe.tied.secondary_copies()}
        mine = [p for p in params if id(p) not in skip]
        total = tp_grad_norm_sq(mine, self.model.mesh.group("tp")).reshape(1)
        comm.all_reduce(total, group=self.model.mesh.group("pp"))
        return math.sqrt(float(total))


class HybridParallelPlugin(StrategyPlugin):
    runs = ("hybrid",)

    def __init__(
        self,
        tp_size: int,
        pp_size: int = 1,
        precision: str = "fp32",
        zero_stage: int = 0,
        enable_sequence_parallelism: bool = False,
        sequence_parallelism_mode: str | None = None,
        sp_size: int | None = None,
        custom_policy: Any = None,
        max_norm: float = 0.0,
        initial_scale: float = 2**16,
        min_scale: float = 1,
        growth_factor: float = 2,
        backoff_factor: float = 0.5,
        growth_interval: int = 1000,
        hysteresis: int = 2,
        max_scale: float = 2**32,
        num_microbatches: int | None = None,
        microbatch_size: int | None = None,
        pp_style: str = "1f1b",
        num_model_chunks: int = 1,
        enable_all_optimization: bool = False,
        gradient_checkpoint_config: Any = None,
        cpu_offload: bool = False,
        **unsupported: Any,
    ) -> None:
        if not isinstance(tp_size, int) or tp_size < 1:
            raise ValueError(f"HybridParallelPlugin: tp_size must be an int >= 1, got {tp_size!r}")
        PipelineSettings.check(
            pp_size, pp_style, num_model_chunks, num_microbatches, microbatch_size
        )
        if pp_size > 1 and sequence_parallelism_mode == "all_to_all":
            raise NotImplementedError(
                "HybridParallelPlugin: all_to_all sequence parallelism with pp_size > 1 is not "
                "built yet; use sequence_parallelism_mode='split_gather'"
            )
        if zero_stage not in (0, 1, 2):
            raise ValueError(
                f"HybridParallelPlugin: zero_stage={zero_stage}; 0, 1 or 2 (stage 3 with "
                "tensor parallelism is not built yet: GeminiPlugin runs stage 3 without tp)"
            )
        mode = (
            (sequence_parallelism_mode or "split_gather") if enable_sequence_parallelism else None
        )
        if mode not in (None, "split_gather", "all_to_all"):
            raise NotImplementedError(
                f"HybridParallelPlugin: sequence_parallelism_mode={mode!r}; built: "
                "'split_gather' (Megatron style, over the tp group) and 'all_to_all' (Ulysses)"
            )
        sp = 1
        if mode == "all_to_all":
            if not sp_size or sp_size < 2:
                raise ValueError(
                    f"HybridParallelPlugin: all_to_all with sp_size={sp_size}; give the sequence "
                    "axis's size, sp_size >= 2 (it runs beside tp_size: world = dp x sp x tp)"
                )
            sp = sp_size
        elif sp_size not in (None, 1) and sp_size != tp_size:
            raise NotImplementedError(
                f"HybridParallelPlugin: sp_size={sp_size}; split_gather runs over the tp group "
                "(sp_size is for sequence_parallelism_mode='all_to_all')"
            )
        if cpu_offload and zero_stage not in (1, 2):
            raise ValueError(
                f"HybridParallelPlugin: cpu_offload=True with zero_stage={zero_stage}; "
                "cpu_offload moves ZeRO's fp32 masters and optimizer states to host memory: "
                "set zero_stage=1 or 2"
            )
        self.checkpointing = checkpoint_config(gradient_checkpoint_config)
        unsupported = {k: v for k, v in unsupported.items() if k not in SPEED_HINTS}
        if unsupported:
            raise NotImplementedError(
                f"HybridParallelPlugin: {sorted(unsupported)} not supported yet (accepted "
                f"and already in effect: {', '.join(sorted(SPEED_HINTS))})"
            )
        self.custom_policy = custom_policy
        self.mesh: Any = None
        offload = None
        if cpu_offload:
            mo = require(
                "megalith_offload", "megalith-offload", "HybridParallelPlugin(cpu_offload)"
            )
            offload = mo.OffloadConfig(tier="host", optim_frac=1.0)
        parallel = Parallel(
            tp=tp_size, pp=pp_size, sp=sp, sequence_parallelism=mode, pp_style=pp_style,
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

    def _default_options(self) -> None:
        self.checkpointing = None
        self.custom_policy = None
        self.mesh = None

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
    def sp_mode(self) -> str | None:
        return self.strategy.parallel.sequence_parallelism

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

    def supported_precisions(self) -> tuple[str, ...]:
        return ("fp32", "bf16", "fp16")

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

    def configure(self, model, optimizer, criterion, dataloader, lr_scheduler):
        import megalith_comm as comm
        from megalith.tensor_parallel import apply_ulysses, policy_for, shard_model
        from megalith.tensor_parallel.ulysses import validate_ulysses

        w = world()
        dp = self._dp()
        policy = None
        if self.tp_size > 1:
            policy = self.custom_policy or policy_for(model)
            policy.validate(model, self.tp_size)  # before the mesh's collectives
        if self.sp_mode == "all_to_all":
            validate_ulysses(model, self.sp_size, self.tp_size)
        if optimizer is not None and any(optimizer.state.values()):
            raise ValueError(
                "HybridParallelPlugin: boost() wants an optimizer that has not stepped"
            )
        model = model.to(w.device)
        before = {id(p): name for name, p in model.named_parameters()}
        if self.pp_size > 1:
            self.mesh = comm.Mesh(
                w, pp=self.pp_size, dp=dp, sp=self.sp_size, tp=self.tp_size, name="hybrid"
            )
        else:
            self.mesh = comm.Mesh(w, dp=dp, sp=self.sp_size, tp=self.tp_size, name="hybrid")
        if self.tp_size > 1:
            shard_model(
                model, self.mesh.group("tp"), sequence_parallel=self.sequence_parallel,
                policy=policy,
            )  # fmt: skip
        if self.sp_mode == "all_to_all":
            apply_ulysses(model, self.mesh.group("sp"))
        if self.checkpointing is not None:
            apply_checkpointing(model, self.checkpointing)
        _replace_params(optimizer, model, before)
        dp_group = self.mesh.group("dp")
        with torch.no_grad():
            for p in model.parameters():
                comm.broadcast(p.data, src=dp_group.global_rank(0), group=dp_group)
        _share_rng(self.mesh.group("tp"))
        if self.pp_size > 1:
            return self._pipeline(model, optimizer, criterion, dataloader, lr_scheduler)
        if self.zero_stage in (1, 2):
            return self._zero(model, optimizer, criterion, dataloader, lr_scheduler)
        wrapped = HybridModel(model, self.precision, self.mesh)
        opt = None
        if optimizer:
            opt = HybridOptimizer(optimizer, wrapped, self.max_norm, self._scaler())
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
        return (
            ZeroModelWrapper(zmodel),
            ZeroOptimizerWrapper(zopt, self.max_norm),
            criterion,
            dataloader,
            lr_scheduler,
        )

    def _pipeline(self, model, optimizer, criterion, dataloader, lr_scheduler):
        """Steps 4 and 5 for pp_size > 1: cut the (tp-sharded) model into stages over the pp axis;
        the optimizer keeps this rank's stages' parameters only; then zero_stage 1 over dp."""
        pipeline = require(
            "megalith_pipeline", "megalith-pipeline", "HybridParallelPlugin(pp_size>1)"
        )
        settings = self.pipeline
        pipe = pipeline.Pipeline(
            model,
            num_microbatches=settings.num_microbatches or 1,
            schedule=settings.schedule,
            chunks=settings.chunks,
            mesh=self.mesh,
            pp_axis="pp",
            dp_axis="dp",
            loss_on_all_ranks=True,
        )
        local = {id(p) for p in pipe.module.parameters()}
        if optimizer is not None:
            for group in optimizer.param_groups:
                group["params"] = [p for p in group["params"] if id(p) in local]
        wrapped = PipelineModel(pipe, settings, self.precision, self.mesh, model)
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
        _, zopt = zero.shard(
            pipe.module, optimizer, self.strategy.zero_config(), mesh=self.mesh, axis="dp",
            model_parallel=self._model_parallel(zero, pipe),
        )  # fmt: skip
        wrapped.zero_no_sync = zopt.no_sync
        zwrapped = ZeroOptimizerWrapper(zopt, self.max_norm)
        zwrapped.pipeline_model = wrapped  # checkpoint_io: names the stages' states
        return wrapped, zwrapped, criterion, dataloader, lr_scheduler

    def execute_pipeline(
        self,
        data_iter: Any,
        model: Any,
        criterion: Any,
        optimizer: Any,
        return_outputs: bool = False,
    ) -> Any:
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
            next(data_iter), criterion, model.zero_no_sync, scale, keep_outputs=return_outputs
        )

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


def _replace_params(optimizer: Any, model: torch.nn.Module, before: dict[int, str]) -> None:
    """Points the optimizer at the sharded parameters.

    Sharding replaces Parameters (a shard is a new tensor), so the optimizer built on
    the full model is re-pointed, each parameter by its name, which sharding keeps.
    """
    if optimizer is None:
        return
    after = dict(model.named_parameters())
    for group in optimizer.param_groups:
        group["params"] = [after[before[id(p)]] if id(p) in before else p for p in group["params"]]
