"""ColossalAI's OneCycleLR (Smith and Topin, 2017, "Super-Convergence"): torch's
OneCycleLR with each group's current lr as its max_lr and total_steps given."""

from __future__ import annotations

from typing import Any

from torch.optim.lr_scheduler import OneCycleLR as _TorchOneCycle

from ._base import torch_optimizer, warn_ignored

# torch's own keywords, passed on (ColossalAI's docstring lists them as kwargs)
_PASSED = ("three_phase", "epochs", "steps_per_epoch")


class OneCycleLR(_TorchOneCycle):
    """ColossalAI's OneCycleLR(optimizer, total_steps, pct_start, anneal_strategy,
    cycle_momentum, base_momentum, max_momentum, div_factor, final_div_factor,
    last_epoch, **kwargs): three_phase is honoured; epochs and steps_per_epoch are
    accepted (total_steps takes precedence, as in torch); verbose is ignored."""

    def __init__(
        self,
        optimizer: Any,
        total_steps: int,
        pct_start: float = 0.3,
        anneal_strategy: str = "cos",
        cycle_momentum: bool = True,
        base_momentum: float = 0.85,
        max_momentum: float = 0.95,
        div_factor: float = 25.0,
        final_div_factor: float = 10000.0,
        last_epoch: int = -1,
        **kwargs: Any,
    ) -> None:
        owner = type(self).__name__
        passed = {k: kwargs.pop(k) for k in _PASSED if k in kwargs}
        verbose = kwargs.pop("verbose", None)
        if verbose:
            warn_ignored(owner, {"verbose": verbose}, "torch deprecated it; print get_last_lr()")
        if kwargs:
            raise TypeError(f"{owner}: unexpected keyword arguments {sorted(kwargs)}")
        opt = torch_optimizer(optimizer, owner)
        super().__init__(
            opt,
            [group["lr"] for group in opt.param_groups],
            total_steps=total_steps,
            pct_start=pct_start,
            anneal_strategy=anneal_strategy,
            cycle_momentum=cycle_momentum,
            base_momentum=base_momentum,
            max_momentum=max_momentum,
            div_factor=div_factor,
            final_div_factor=final_div_factor,
            last_epoch=last_epoch,
            **passed,
        )
