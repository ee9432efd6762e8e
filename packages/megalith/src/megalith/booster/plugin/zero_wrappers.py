"""The boosted model and optimizer of the ZeRO plugins (LowLevelZeroPlugin, GeminiPlugin).

The optimizer's state_dict() is torch's form of the whole optimizer ({"state": {index:
{"step", "exp_avg", ...}}, "param_groups": [...]}, parameters numbered in param-group
order, every state its full unsharded tensor), gathered one chunk at a time, so it
loads into a plain torch optimizer of the same model and back into any ZeRO layout;
load_state_dict() takes that form (each rank keeps the slices its shards hold).
The model's state_dict() is the full one (fp32 master values and buffers, keyed by the
user's parameter names); under Gemini it is gathered, on rank 0 (only_rank_0=True) or
on every rank. Both are collective where they gather: every rank calls them.
"""

from __future__ import annotations

import math
import tempfile
from pathlib import Path
from typing import Any

import torch
from torch.nn.modules.module import _IncompatibleKeys
from torch.utils._pytree import tree_map

from ..wrappers import ModelWrapper, OptimizerWrapper
from .base import require


def _zero() -> Any:
    return require("megalith_zero", "megalith-zero", "ZeRO state dicts")


class ZeroModelWrapper(ModelWrapper):
    """module: megalith_zero's ZeroModel; unwrap(): the user's module. file_layout: a
    megalith_zero.FileLayout when the parameters are tensor-parallel shards (GeminiPlugin
    with tp_size > 1): state_dict() gathers them whole, load_state_dict() takes whole ones."""

    def __init__(self, zmodel: Any, force_outputs_fp32: bool = False, file_layout: Any = None):
        super().__init__(zmodel, zmodel.module)
        self.force_outputs_fp32 = force_outputs_fp32
        self.file_layout = file_layout

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        out = self.module(*args, **kwargs)
        if self.force_outputs_fp32:
            out = tree_map(
                lambda t: t.float() if isinstance(t, torch.Tensor) and t.is_floating_point() else t,
                out,
            )
        return out

    def state_dict(  # type: ignore[override]
        self,
        destination: Any = None,
        prefix: str = "",
        keep_vars: bool = False,
        only_rank_0: bool = True,
    ) -> dict[str, torch.Tensor]:
        """Stage 3 (GeminiPlugin): every parameter's fp32 value and every persistent
        buffer, keyed by the user's names (with `prefix`); collective: gathered on every
        rank, kept on rank 0 only with only_rank_0 (the other ranks get an empty dict).
        Stages 1 and 2 (every rank holds the whole model): the user's module's own
        state_dict (working dtype), on this rank alone, as ColossalAI's."""
        zmodel = self.module
        user = zmodel.module
        if zmodel.stage3 is None:
            zmodel.wait_params()
            return user.state_dict(destination=destination, prefix=prefix, keep_vars=keep_vars)
        full = zmodel.full_state_dict()
        keep = set(user.state_dict(keep_vars=True)) | {n for n, _ in user.named_parameters()}
        out = destination if destination is not None else {}
        if self.file_layout is not None:  # tensor-parallel shards made whole (collective)
            full = {k: self.file_layout.to_full(k, v) for k, v in full.items() if k in keep}
        if only_rank_0 and _world_rank() != 0:
            return out
        for k, v in full.items():
            if k in keep:
                out[prefix + k] = v.cpu()
        return out

    def load_state_dict(  # type: ignore[override]
        self, state_dict: dict[str, torch.Tensor], strict: bool = True, assign: bool = False
    ) -> _IncompatibleKeys:
        """Collective; every rank passes the full state dict (the user's names). The
        optimizer's states are kept (as torch's model.load_state_dict keeps them)."""
        zmodel = self.module
        user = zmodel.module
        expected = set(dict(user.named_parameters())) | set(user.state_dict(keep_vars=True))
        missing = sorted(expected - set(state_dict))
        unexpected = sorted(set(state_dict) - expected)
        if strict and (missing or unexpected):
            raise RuntimeError(
                f"Error(s) in loading state_dict for {type(user).__name__}: missing keys "
                f"{missing[:5]}, unexpected keys {unexpected[:5]} (pass strict=False to load "
                "only what matches)"
            )
        tensors = {k: v for k, v in state_dict.items() if k in expected}
        if self.file_layout is not None:  # whole tensors to this rank's tp shards
            tensors = {k: self.file_layout.to_local(k, v) for k, v in tensors.items()}
        if missing:
            current = zmodel.full_state_dict()
            tensors.update({k: current[k] for k in missing if k in current})
        zopt = zmodel.optimizer
        kept = optimizer_state_dict(zopt) if _stepped(zopt) else None
        _load_full_from(zmodel, zopt, tensors)
        if kept is not None:
            load_optimizer_state_dict(zopt, kept)
        return _IncompatibleKeys(missing, unexpected)


def _world_rank() -> int:
    import megalith_comm as comm

    return comm.get_world().rank


def _stepped(zopt: Any) -> bool:
    return any(any(c.steps) for c in zopt.trainable)


def _load_full_from(zmodel: Any, zopt: Any, tensors: dict[str, torch.Tensor]) -> None:
    """megalith_zero.load_full from an in-memory state dict (through this rank's own
    temporary files: load_full handles every placement of the chunks)."""
    from megalith_core.safetensors_files import write_tensors

    cpu = {k: v.detach().to("cpu").contiguous() for k, v in tensors.items()}
    with tempfile.TemporaryDirectory(prefix="megalith-load-") as tmp:
        write_tensors(Path(tmp), "model", cpu, 1 << 62, write=True)
        _zero().load_full(zmodel, zopt, tmp)


class ZeroOptimizerWrapper(OptimizerWrapper):
    """zero_optimizer: megalith_zero's ZeroOptimizer; optim (and unwrap()): the user's
    torch optimizer, as ColossalAI's, its state viewing this rank's shards (so its
    state_dict() works; under every plugin that runs ZeRO: LowLevelZero, Gemini,
    HybridParallel). param_groups are the user's optimizer's own dicts."""

    def __init__(self, zopt: Any, model: ZeroModelWrapper, max_norm: float, only_rank_0: bool):
        self.zero_optimizer = zopt
        self._grad_norm: float | None = None
        self.model = model
        self.max_norm = max_norm
        self.only_rank_0 = only_rank_0
        self._clipped_norm: float | None = None

    @property
    def optim(self) -> torch.optim.Optimizer:  # type: ignore[override]
        from .zero_optimizers import refresh_state_views

        refresh_state_views(self.zero_optimizer)
        return self.zero_optimizer.optimizer

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        return self.zero_optimizer.param_groups

    @property
    def state(self) -> Any:
        """The user's torch optimizer's state, each entry viewing this rank's shard."""
        from .zero_optimizers import refresh_state_views

        refresh_state_views(self.zero_optimizer)
        return self.zero_optimizer.optimizer.state

    @property
    def defaults(self) -> dict[str, Any]:
        return self.zero_optimizer.optimizer.defaults

    def add_param_group(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(
            "ZeRO optimizer: add_param_group after boost(); ZeRO's chunks are laid out at "
            "boost(): put every param group in the optimizer before boosting it"
        )

    @property
    def loss_scale(self) -> float:
        return self.zero_optimizer.loss_scale

    def backward(
        self, loss: torch.Tensor, inputs: Any = None, retain_graph: bool = False, **kwargs: Any
    ) -> None:
        if inputs is not None:
            kwargs["inputs"] = inputs
        if retain_graph:
            kwargs["retain_graph"] = True
        self.zero_optimizer.backward(loss, **kwargs)

    def backward_by_grad(
        self,
        tensor: torch.Tensor,
        grad: torch.Tensor,
        inputs: Any = None,
        retain_graph: bool = False,
    ) -> None:
        """Backward from `tensor` with upstream gradient `grad`, scaled as the loss is."""
        torch.autograd.backward(
            tensor, grad * self.loss_scale, inputs=inputs, retain_graph=retain_graph
        )

    def scale_loss(self, loss: torch.Tensor) -> torch.Tensor:
        return loss * self.loss_scale

    def _clip(self, max_norm: float, norm_type: float = 2.0) -> float:
        """The whole model's gradient norm, the gradients to be clipped by it."""
        return self.zero_optimizer.clip_grad_norm_(max_norm, norm_type)

    def clip_grad_by_norm(
        self,
        max_norm: float,
        norm_type: float = 2.0,
        error_if_nonfinite: bool = False,
        *args: Any,
        **kwargs: Any,
    ) -> torch.Tensor:
        """The global L2 norm over every shard (unscaled); the next step() scales the
        gradients by min(1, max_norm / (norm + 1e-6)), as torch's clip_grad_norm_."""
        norm = self._clip(max_norm, norm_type)
        if error_if_nonfinite and not math.isfinite(norm):
            raise RuntimeError(
                f"clip_grad_by_norm: the total norm of the gradients is {norm}; pass "
                "error_if_nonfinite=False to skip the check"
            )
        self._clipped_norm = norm
        return torch.tensor(norm)

    def clip_grad_by_value(self, clip_value: float, *args: Any, **kwargs: Any) -> None:
        """Every gradient element into [-clip_value, clip_value] (on each rank's shards,
        after reduction, in the loss-scaled units the shards hold)."""
        zopt = self.zero_optimizer
        if zopt.step_in_backward:
            raise RuntimeError(
                "clip_grad_by_value: the chunks are updated during backward "
                "(step_in_backward), so their gradients cannot be clipped; set "
                "step_in_backward=False on the plugin (set_offload) to clip"
            )
        zopt.reducer.wait()
        bound = float(clip_value) * self.loss_scale
        with torch.no_grad():
            for c in zopt.trainable:
                c.shard_grad.clamp_(-bound, bound)

    def step(self, *args: Any, **kwargs: Any) -> Any:
        zopt = self.zero_optimizer
        norm = self._clipped_norm
        if norm is None and not zopt.step_in_backward:
            # The norm ColossalAI reports (and clips by, with max_norm): with max_norm 0 the
            # clip coefficient is min(1, inf) = 1, the step is unchanged.
            norm = zopt.clip_grad_norm_(self.max_norm if self.max_norm > 0 else math.inf)
        self._grad_norm = norm
        self._clipped_norm = None
        return zopt.step()

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.zero_optimizer.zero_grad(set_to_none)

    def no_sync(self):
        return self.zero_optimizer.no_sync()

    def state_dict(self, only_rank_0: bool | None = None) -> dict[str, Any]:
        """torch's form of the whole optimizer. Collective; with only_rank_0 (GeminiPlugin's
        default) the other ranks get {"state": {}, "param_groups": [...]}."""
        only = self.only_rank_0 if only_rank_0 is None else only_rank_0
        out = optimizer_state_dict(self.zero_optimizer)
        if only and self.zero_optimizer.model.group.rank != 0:
            out["state"] = {}
        return out

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """torch's form (from state_dict(), a torch optimizer's, or a file of either)."""
        load_optimizer_state_dict(self.zero_optimizer, state_dict)


# -- torch's optimizer state_dict form, to and from ZeRO's chunks ------------------------
def _numbering(zopt: Any) -> tuple[dict[str, int], list[dict[str, Any]]]:
    """Parameter name -> torch's index (param-group order), and the groups with indices."""
    names = {id(p): n for n, p in zopt.model.module.named_parameters()}
    index: dict[str, int] = {}
    groups = []
    for g in zopt.optimizer.param_groups:
        ids = []
        for p in g["params"]:
            index.setdefault(names[id(p)], len(index))
            ids.append(index[names[id(p)]])
        groups.append({**{k: v for k, v in g.items() if k != "params"}, "params": ids})
    return index, groups


def optimizer_state_dict(zopt: Any) -> dict[str, Any]:
    """Collective over ZeRO's group: every rank gets the whole state dict."""
    from megalith_core.optimizer_files import SEP
    from megalith_zero.full_optimizer import full_plan, full_states
    from megalith_zero.offload import resident_states

    index, groups = _numbering(zopt)
    zopt.reducer.wait()
    state: dict[int, dict[str, Any]] = {}
    with resident_states(zopt):
        _, params = full_plan(zopt)
        for key, tensor in full_states(zopt):
            name, which = key.split(SEP, 1)
            state.setdefault(index[name], {})[which] = tensor
    if zopt.rule.kind != "sgd":  # torch's SGD keeps no step
        for name, meta in params.items():
            if meta["step"] and index[name] in state:
                entry = state[index[name]]
                state[index[name]] = {"step": torch.tensor(float(meta["step"])), **entry}
    return {"state": state, "param_groups": groups}


def load_optimizer_state_dict(zopt: Any, state_dict: dict[str, Any]) -> None:
    """Each rank copies the slices of every state its shards hold; not collective."""
    index, groups = _numbering(zopt)
    saved_groups = state_dict["param_groups"]
    if len(saved_groups) != len(groups) or any(
        len(a["params"]) != len(b["params"]) for a, b in zip(saved_groups, groups)
    ):
        raise ValueError(
            "load_state_dict: the state dict's param groups do not match the optimizer's "
            f"({[len(g['params']) for g in saved_groups]} vs "
            f"{[len(g['params']) for g in groups]} parameters): a state dict of another model?"
        )
    from megalith_zero.state_load import load_param_states

    saved = state_dict["state"]
    load_param_states(zopt, {name: saved.get(i, {}) for name, i in index.items()})
    for g, s in zip(zopt.optimizer.param_groups, saved_groups):
        for k, v in s.items():
            if k != "params":
                g[k] = tuple(v) if isinstance(v, list) else v
