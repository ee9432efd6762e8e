"""TorchFSDPPlugin: torch's FSDP2 (`fully_shard`) with ColossalAI's TorchFSDPPlugin arguments.

ColossalAI's plugin takes FSDP1's arguments; here they drive FSDP2: sharding_strategy
FULL_SHARD / SHARD_GRAD_OP is reshard_after_forward True / False (the other strategies
only change communication: warned, run as FULL_SHARD); cpu_offload=CPUOffload(
offload_params=True) is CPUOffloadPolicy; auto_wrap_policy (FSDP1's callable of
module, recurse, nonwrapped_numel) picks the submodules sharded as units of their own;
mixed_precision (FSDP1's MixedPrecision) is MixedPrecisionPolicy with its param and
reduce dtypes, buffers in buffer_dtype, and BatchNorm layers kept in fp32 as FSDP1
keeps them; ignored_modules' parameters stay unsharded; param_init_fn materialises
meta-device modules; sync_module_states broadcasts rank 0's parameters and buffers.

The user's optimizer keeps its param groups: their parameters are replaced by the
sharded ones (so an LR scheduler built on it before boost() still drives it), and an
optimizer that has stepped (a resumed script) keeps its states as their shards. The
boosted model's and optimizer's state_dict() are the full ones (gathered, plain
tensors, on every rank), and checkpoints are GeneralCheckpointIO's files, gathered
and re-sharded tensor by tensor (FSDPCheckpointIO).
"""

from __future__ import annotations

import contextlib
import itertools
import warnings
from pathlib import Path
from typing import Any

import torch

from megalith.nn.optimizer.fp32_shadows import Fp32Shadows
from megalith.strategy import Strategy

from ..checkpoint_io import GeneralCheckpointIO
from ..checkpoint_io.general import WholeStates, named_tensors
from ..wrappers import ModelWrapper, OptimizerWrapper
from .base import StrategyPlugin, warn_non_defaults, world
from .dp_plugin_base import DPPluginBase

_SHADOWS = Fp32Shadows(keep_masters=False)

_NAMES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16", None: "fp32"}


def _dtensor() -> Any:
    from torch.distributed.tensor import DTensor

    return DTensor


def full(t: torch.Tensor) -> torch.Tensor:
    """A DTensor's whole value (collective over its mesh); a plain tensor as it is."""
    return t.full_tensor() if isinstance(t, _dtensor()) else t


def local_like(value: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """The whole `value` as `like` holds it: a DTensor of like's mesh and placements
    (this rank's slice; no communication), or the value itself."""
    if isinstance(like, _dtensor()):
        from torch.distributed.tensor import distribute_tensor

        value = value.to(device=like.device, dtype=like.dtype)
        return distribute_tensor(value, like.device_mesh, like.placements, src_data_rank=None)
    return value


def check_shardable_states(optimizer: torch.optim.Optimizer, names: dict[int, str]) -> None:
    """Refuses, before anything is sharded, a stepped optimizer's state that FSDP cannot
    slice as it slices the parameter: a tensor of another shape (a factored second
    moment) or a quantised one (int8 moments, whose block scales do not slice)."""
    for p, entry in optimizer.state.items():
        for k, v in entry.items():
            if not torch.is_tensor(v) or v.dim() == 0:
                continue
            if not v.is_floating_point():
                raise ValueError(
                    f"TorchFSDPPlugin: boost() of an optimizer that has stepped: its state "
                    f"{k!r} of {names.get(id(p), 'a parameter')!r} is quantised "
                    f"({v.dtype}), and its blocks do not follow FSDP's slices: boost the "
                    "optimizer before its first step, or keep fp32 / bf16 states "
                    "(state_dtype='fp32' or 'bf16')"
                )
            if v.shape != p.shape:
                raise ValueError(
                    f"TorchFSDPPlugin: boost() of an optimizer that has stepped: its state "
                    f"{k!r} of {names.get(id(p), 'a parameter')!r} has shape "
                    f"{tuple(v.shape)}, the parameter {tuple(p.shape)}, and only states of "
                    "the parameter's shape can become its FSDP shards: boost the optimizer "
                    "before its first step, or use one whose states have the parameter's "
                    "shape (Adam, AdamW, SGD)"
                )


def follow_fsdp_params(
    optimizer: torch.optim.Optimizer, model: torch.nn.Module, names: dict[int, str]
) -> None:
    """Points the optimizer at the model's parameters after fully_shard (by the names
    they had before) and makes each parameter's states this rank's shards of them, in
    the states' own dtype ("step" and other scalars kept)."""
    now = dict(model.named_parameters(remove_duplicate=False))
    for g in optimizer.param_groups:
        params = []
        for p in g["params"]:
            q = now[names[id(p)]]
            entry = optimizer.state.pop(p, None)
            if entry:
                optimizer.state[q] = {k: _state_shard(v, q) for k, v in entry.items()}
            params.append(q)
        g["params"] = params


def _state_shard(value: Any, param: torch.Tensor) -> Any:
    if not torch.is_tensor(value) or value.dim() == 0:
        return value
    value = value.detach().to(param.device)
    if not isinstance(param, _dtensor()):  # an ignored module's parameter
        return value
    from torch.distributed.tensor import distribute_tensor

    return distribute_tensor(value, param.device_mesh, param.placements, src_data_rank=None)


class TorchFSDPModel(ModelWrapper):
    """module: the user's module, fully_shard'ed (it is also what unwrap() gives)."""

    def __init__(self, module: torch.nn.Module):
        super().__init__(module, module)

    def state_dict(self, destination: Any = None, prefix: str = "", keep_vars: bool = False):  # type: ignore[override]
        """The full state dict (plain tensors, the user's names) on every rank; collective."""
        out = destination if destination is not None else {}
        for k, v in self.module.state_dict().items():
            out[prefix + k] = full(v).detach().cpu()
        return out

    def load_state_dict(
        self, state_dict: dict[str, Any], strict: bool = True, assign: bool = False
    ):  # type: ignore[override]
        """A full state dict (every rank passes it); each rank keeps its shards."""
        own = self.module.state_dict()
        converted = {k: local_like(v, own[k]) if k in own else v for k, v in state_dict.items()}
        return self.module.load_state_dict(converted, strict=strict)


class FSDPOptimizer(OptimizerWrapper):
    def __init__(self, optim: torch.optim.Optimizer, model: TorchFSDPModel):
        super().__init__(optim)
        self.model = model
        self._clipped_norm: float | None = None

    def unwrap_model(self) -> TorchFSDPModel:
        return self.model

    def clip_grad_by_norm(
        self,
        max_norm: float,
        norm_type: float = 2.0,
        error_if_nonfinite: bool = False,
        *args: Any,
        **kwargs: Any,
    ) -> torch.Tensor:
        norm = full(
            super().clip_grad_by_norm(max_norm, norm_type, error_if_nonfinite, *args, **kwargs)
        )
        if norm_type == 2.0:
            self._clipped_norm = float(norm)
        return norm

    def step(self, *args: Any, **kwargs: Any) -> Any:
        norm = self._clipped_norm
        if norm is None:
            grads = [p.grad for p in self.parameters if p.grad is not None]
            norm = float(full(torch.nn.utils.get_total_norm(grads))) if grads else None
        self._grad_norm, self._clipped_norm = norm, None
        if not _engine_optimizer(self.optim):
            return self.optim.step(*args, **kwargs)
        # megalith's engine kernels step plain fp32 tensors: each DTensor shard (and a
        # bf16 one in fp32 math, states in its dtype, as ColossalAI's HybridAdam) through
        # a local fp32 shadow
        with _SHADOWS.stepping(self.optim):
            return self.optim.step(*args, **kwargs)

    def state_dict(self) -> dict[str, Any]:
        """torch's form with every state whole (collective: every rank gets it)."""
        sd = self.optim.state_dict()
        sd["state"] = {
            i: {
                k: full(v).detach().cpu() if torch.is_tensor(v) and k != "step" else v
                for k, v in s.items()
            }
            for i, s in sorted(sd["state"].items())
        }
        return sd

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """torch's form with whole states (this state_dict()'s, or a plain torch
        optimizer's of the same model); each rank keeps its shards."""
        params = self.parameters
        state = {
            i: {
                k: local_like(v, params[i]) if torch.is_tensor(v) and k != "step" else v
                for k, v in s.items()
            }
            for i, s in state_dict["state"].items()
        }
        self.optim.load_state_dict({"state": state, "param_groups": state_dict["param_groups"]})


def _engine_optimizer(optim: Any) -> bool:
    from megalith_core.optim._base import EngineOptimizer

    return isinstance(optim, EngineOptimizer)


class _ShardedStates(WholeStates):
    """Optimizer states of FSDP's DTensor parameters: gathered whole, sliced back."""

    def to_full(self, state: torch.Tensor, param: torch.Tensor) -> torch.Tensor:
        return full(state).detach().float().cpu()

    def to_local(self, whole: torch.Tensor, param: torch.Tensor) -> torch.Tensor:
        return local_like(whole, param)


class FSDPCheckpointIO(GeneralCheckpointIO):
    """GeneralCheckpointIO's files for FSDP2 models: each tensor gathered whole (every
    rank takes part; rank 0 writes) and sliced back on loading."""

    def model_tensors(self, model: Any) -> dict[str, torch.Tensor]:
        return {k: full(v) for k, v in named_tensors(self.whole_module(model)).items()}

    def read_model(self, model: Any, directory: Path, strict: bool) -> None:
        from megalith_core.safetensors_files import TensorReader

        want = named_tensors(self.whole_module(model))
        with TensorReader(directory, "model") as reader, torch.no_grad():
            missing = [k for k in want if not reader.has(k)]
            if missing and strict:
                raise KeyError(
                    f"{directory}: missing {missing[:5]}: a checkpoint of another model?"
                )
            for k, t in want.items():
                if reader.has(k):
                    src = reader.get(k)
                    if tuple(src.shape) != tuple(t.shape):
                        raise ValueError(
                            f"{directory}: {k!r} has shape {list(src.shape)}, the model {list(t.shape)}"
                        )
                    mine = local_like(src, t)
                    dst = t.to_local() if isinstance(t, _dtensor()) else t
                    dst.copy_(mine.to_local() if isinstance(mine, _dtensor()) else mine)

    def state_layout(self, model: Any) -> WholeStates:
        return _ShardedStates()


_warned_unpinned = False


def _offload_policy(offload_params: bool, device: torch.device) -> Any:
    """FSDP1's CPUOffload(offload_params=True) as FSDP2's CPUOffloadPolicy. Its pinned
    host copies need an accelerator; on CPU ranks the parameters are in host memory
    already, so the offload runs unpinned (warned once): the same numbers."""
    from torch.distributed.fsdp import CPUOffloadPolicy, OffloadPolicy

    global _warned_unpinned
    if not offload_params:
        return OffloadPolicy()
    if device.type == "cuda":
        return CPUOffloadPolicy()
    if not _warned_unpinned:
        _warned_unpinned = True
        warnings.warn(
            "TorchFSDPPlugin(cpu_offload=CPUOffload(offload_params=True)) on CPU ranks: the "
            "parameters are in host memory already; FSDP2's CPUOffloadPolicy runs with "
            "pin_memory=False (pinning needs an accelerator)",
            UserWarning,
            stacklevel=4,
        )
    return CPUOffloadPolicy(pin_memory=False)


def _enum_name(value: Any) -> str | None:
    return None if value is None else getattr(value, "name", str(value))


class TorchFSDPPlugin(StrategyPlugin, DPPluginBase):
    """ColossalAI's TorchFSDPPlugin arguments (FSDP1's), run on FSDP2's fully_shard."""

    runs = ("ddp",)

    def __init__(
        self,
        process_group: Any = None,
        sharding_strategy: Any = None,
        cpu_offload: Any = None,
        auto_wrap_policy: Any = None,
        backward_prefetch: Any = None,
        mixed_precision: Any = None,
        ignored_modules: Any = None,
        param_init_fn: Any = None,
        sync_module_states: bool = False,
        fp8_communication: bool = False,
    ) -> None:
        strategy = _enum_name(sharding_strategy) or "FULL_SHARD"
        if strategy not in (
            "FULL_SHARD",
            "SHARD_GRAD_OP",
            "NO_SHARD",
            "HYBRID_SHARD",
            "_HYBRID_SHARD_ZERO2",
        ):
            raise ValueError(
                f"TorchFSDPPlugin: sharding_strategy={sharding_strategy!r}; expected a "
                "torch.distributed.fsdp.ShardingStrategy"
            )
        warn_non_defaults(
            "TorchFSDPPlugin",
            dict(
                sharding_strategy=strategy
                if strategy not in ("FULL_SHARD", "SHARD_GRAD_OP")
                else None,
                backward_prefetch=backward_prefetch,
                fp8_communication=fp8_communication,
            ),
            dict(
                sharding_strategy=(
                    None,
                    "FSDP2 shards over the whole group: run as FULL_SHARD, the same numbers",
                ),
                backward_prefetch=(None, "FSDP2 prefetches the next unit itself"),
                fp8_communication=(False, "FSDP2 communicates in the parameters' dtype"),
            ),
        )
        mp = mixed_precision
        if mp is not None and getattr(mp, "keep_low_precision_grads", False):
            raise ValueError(
                "TorchFSDPPlugin: mixed_precision with keep_low_precision_grads=True; FSDP2 "
                "gives gradients in the parameters' dtype: pass keep_low_precision_grads=False"
            )
        self.process_group = process_group
        self.reshard_after_forward = strategy != "SHARD_GRAD_OP"
        self.offload_params = bool(getattr(cpu_offload, "offload_params", False))
        self.auto_wrap_policy = auto_wrap_policy
        self.mp = mp
        self.ignored_modules = list(ignored_modules or [])
        self.param_init_fn = param_init_fn
        self.sync_module_states = sync_module_states
        param_dtype = getattr(mp, "param_dtype", None) if mp is not None else None
        super().__init__(Strategy(plugin="ddp", precision=_NAMES.get(param_dtype, "fp32")))

    def supported_precisions(self) -> tuple[str, ...]:
        return ("fp32", "fp16", "bf16")

    def support_no_sync(self) -> bool:
        return False

    def no_sync(self, model: Any, optimizer: Any) -> contextlib.AbstractContextManager:
        raise NotImplementedError(
            "TorchFSDPPlugin.no_sync: FSDP reduces each backward's gradients (as ColossalAI's "
            "plugin); accumulate by calling backward several times before step(), or use "
            "TorchDDPPlugin / LowLevelZeroPlugin for no_sync"
        )

    def configure(self, model, optimizer, criterion, dataloader, lr_scheduler):
        w = world()
        names = {id(p): n for n, p in model.named_parameters(remove_duplicate=False)}
        if optimizer is not None:
            check_shardable_states(optimizer, names)
        model = apply_fsdp(self, model, w.device)
        wrapped = TorchFSDPModel(model)
        opt = None
        if optimizer is not None:
            # an optimizer that has stepped (resumed, warmed up): its states follow
            # their parameters onto FSDP's shards
            follow_fsdp_params(optimizer, model, names)
            opt = FSDPOptimizer(optimizer, wrapped)
        return wrapped, opt, criterion, dataloader, lr_scheduler

    def get_checkpoint_io(self) -> FSDPCheckpointIO:
        return FSDPCheckpointIO()


def apply_fsdp(
    plugin: TorchFSDPPlugin, model: torch.nn.Module, device: torch.device
) -> torch.nn.Module:
    """fully_shard over `model` in FSDP1's order: materialise, sync, then the units from
    the leaves up (BatchNorm layers in fp32, auto_wrap_policy's picks), the root last."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    if plugin.param_init_fn is not None:
        for m in model.modules():
            own = itertools.chain(m.parameters(recurse=False), m.buffers(recurse=False))
            if any(t.is_meta for t in own):
                plugin.param_init_fn(m)
    if device.type == "cuda":
        model = model.to(device)
    group = plugin.process_group or dist.group.WORLD
    if plugin.sync_module_states:
        src = dist.get_global_rank(group, 0)
        with torch.no_grad():
            for t in itertools.chain(model.parameters(), model.buffers()):
                dist.broadcast(t.data, src=src, group=group)
    mp = plugin.mp
    param_dtype = getattr(mp, "param_dtype", None) if mp is not None else None
    reduce_dtype = getattr(mp, "reduce_dtype", None) if mp is not None else None
    buffer_dtype = getattr(mp, "buffer_dtype", None) if mp is not None else None
    batch_norms = [
        m for m in model.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)
    ]
    if buffer_dtype is not None:
        keep = {id(b) for m in batch_norms for b in m.buffers()}
        for m in model.modules():
            for name, b in m._buffers.items():
                if b is not None and b.is_floating_point() and id(b) not in keep:
                    m._buffers[name] = b.to(buffer_dtype)
    ignored = {p for m in plugin.ignored_modules for p in m.parameters()}
    kw = dict(
        mesh=DeviceMesh.from_group(group, device.type),
        reshard_after_forward=plugin.reshard_after_forward,
        offload_policy=_offload_policy(plugin.offload_params, device),
        ignored_params=ignored or None,
    )
    policy = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=reduce_dtype)
    done: set[int] = set()

    def shard(m: torch.nn.Module, mp_policy: Any = policy) -> None:
        if id(m) not in done and any(p not in ignored for p in m.parameters()):
            fully_shard(m, mp_policy=mp_policy, **kw)
            done.add(id(m))

    if param_dtype is not None:  # FSDP1 leaves BatchNorm out of mixed precision
        for m in batch_norms:
            shard(m, MixedPrecisionPolicy(reduce_dtype=reduce_dtype))
    wrap = plugin.auto_wrap_policy

    def visit(m: torch.nn.Module, root: bool) -> int:
        """FSDP1's recursive wrap: the parameters wrapped in m's subtree."""
        numel = sum(p.numel() for p in m.parameters() if p not in ignored)
        if not wrap(module=m, recurse=True, nonwrapped_numel=numel):
            return 0
        wrapped = sum(visit(c, False) for c in m.children())
        if not root and wrap(module=m, recurse=False, nonwrapped_numel=numel - wrapped):
            shard(m)
            return numel
        return wrapped

    if wrap is not None:
        visit(model, True)
    fully_shard(model, mp_policy=policy, **kw)
    return model
