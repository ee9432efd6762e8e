"""What Booster.boost returns: the model and optimizer, wrapped, with ColossalAI's surface.

ModelWrapper: `module` (what the plugin wraps), `unwrap()` (the user's own module, for
saving and inspecting), forward. OptimizerWrapper: ColossalAI's OptimizerWrapper over a
torch optimizer whose parameters are whole on every rank (plain data parallelism);
the ZeRO and FSDP plugins' wrappers subclass it and change what sharding changes.
`param_groups` are the user's optimizer's own dicts, so an LR scheduler built on the
user's optimizer before boost() keeps driving the boosted one.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch


class ModelWrapper(torch.nn.Module):
    """A boosted model. `unwrap()` gives the user's module (for saving, inspecting)."""

    def __init__(self, module: torch.nn.Module, user_module: torch.nn.Module | None = None):
        super().__init__()
        self.module = module
        # not a submodule (it already is one, inside `module`): a plain attribute
        self.__dict__["_user_module"] = user_module

    def unwrap(self, unwrap_peft: bool = True) -> torch.nn.Module:
        """The module as given to boost() (a peft model's base model with unwrap_peft)."""
        m = self.__dict__.get("_user_module")
        if m is None:
            m = self.module
            while hasattr(m, "module") and isinstance(m.module, torch.nn.Module):
                m = m.module
        if unwrap_peft and hasattr(m, "get_base_model") and hasattr(m, "peft_config"):
            return m.get_base_model()
        return m

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.module(*args, **kwargs)


class OptimizerWrapper:
    """A boosted optimizer: backward(loss), step(), zero_grad(), the clipping methods,
    get_grad_norm() (the norm of the gradients the last step() used), state_dict()."""

    def __init__(self, optim: Any):
        self.optim = optim
        self._grad_norm: float | None = None

    # -- the user's optimizer, seen through ---------------------------------------------
    @property
    def parameters(self) -> list[torch.nn.Parameter]:
        return [p for g in self.param_groups for p in g["params"]]

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        return self.optim.param_groups

    @property
    def defaults(self) -> dict[str, Any]:
        return getattr(self.optim, "defaults", {})

    @property
    def state(self) -> Any:
        return self.optim.state

    def add_param_group(self, *args: Any, **kwargs: Any) -> Any:
        return self.optim.add_param_group(*args, **kwargs)

    def unwrap(self) -> Any:
        return self.optim

    # -- a step ------------------------------------------------------------------
    def backward(
        self, loss: torch.Tensor, inputs: Any = None, retain_graph: bool = False, **kwargs: Any
    ) -> None:
        loss.backward(inputs=inputs, retain_graph=retain_graph, **kwargs)

    def backward_by_grad(
        self,
        tensor: torch.Tensor,
        grad: torch.Tensor,
        inputs: Any = None,
        retain_graph: bool = False,
    ) -> None:
        """Backward from `tensor` with upstream gradient `grad` (as torch.autograd.backward)."""
        torch.autograd.backward(tensor, grad, inputs=inputs, retain_graph=retain_graph)

    def step(self, *args: Any, **kwargs: Any) -> Any:
        self._grad_norm = _total_norm(self.parameters)
        return self.optim.step(*args, **kwargs)

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.optim.zero_grad(set_to_none=set_to_none)

    # -- gradients ----------------------------------------------------------------
    def clip_grad_by_norm(
        self,
        max_norm: float,
        norm_type: float = 2.0,
        error_if_nonfinite: bool = False,
        *args: Any,
        **kwargs: Any,
    ) -> torch.Tensor:
        """torch.nn.utils.clip_grad_norm_ over every parameter; returns the total norm."""
        return torch.nn.utils.clip_grad_norm_(
            self.parameters, max_norm, norm_type, error_if_nonfinite, *args, **kwargs
        )

    def clip_grad_by_value(self, clip_value: float, *args: Any, **kwargs: Any) -> None:
        """torch.nn.utils.clip_grad_value_: every gradient element into [-v, v]."""
        torch.nn.utils.clip_grad_value_(self.parameters, clip_value, *args, **kwargs)

    def get_grad_norm(self, norm_type: float = 2.0, **kwargs: Any) -> float | None:
        """The L2 norm of the (unscaled) gradients the last step() used; None before one."""
        if norm_type != 2.0:
            raise ValueError(
                f"get_grad_norm(norm_type={norm_type}): the L2 norm is recorded; pass norm_type=2.0"
            )
        return getattr(self, "_grad_norm", None)

    def scale_loss(self, loss: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError(
            f"{type(self).__name__}.scale_loss: this optimizer does not scale losses "
            "(fp16 mixed precision does); call backward(loss)"
        )

    def unscale_grad(self) -> None:
        raise NotImplementedError(
            f"{type(self).__name__}.unscale_grad: this optimizer does not scale losses "
            "(fp16 mixed precision does)"
        )

    # -- state --------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return self.optim.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.optim.load_state_dict(state_dict)

    def no_sync(self) -> Iterator[None]:
        raise NotImplementedError(
            f"{type(self).__name__}.no_sync: use booster.no_sync(model, optimizer)"
        )

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.optim!r})"


def _total_norm(params: list[torch.nn.Parameter]) -> float | None:
    """The L2 norm of the parameters' gradients (None when none has one)."""
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return None
    return float(torch.nn.utils.get_total_norm(grads, 2.0))
