"""FusedSGD with ColossalAI's (apex's) signature, on megalith.optim's fused SGD:
torch.optim.SGD's update and state layout, on CPU and CUDA parameters."""

from __future__ import annotations

from megalith_core.optim import HybridSGD as _HybridSGD

from ._common import ParamsT


class FusedSGD(_HybridSGD):
    """ColossalAI's FusedSGD(params, lr, momentum, dampening, weight_decay, nesterov,
    wd_after_momentum). lr is required, as in ColossalAI. wd_after_momentum=True (weight
    decay added after the momentum buffer) is refused: megalith's SGD adds it to the
    gradient first, as torch.optim.SGD does."""

    def __init__(
        self,
        params: ParamsT,
        lr: float,
        momentum: float = 0.0,
        dampening: float = 0.0,
        weight_decay: float = 0.0,
        nesterov: bool = False,
        wd_after_momentum: bool = False,
    ) -> None:
        if wd_after_momentum:
            raise NotImplementedError(
                "FusedSGD: wd_after_momentum=True is not supported; megalith's SGD adds weight "
                "decay to the gradient before momentum (torch.optim.SGD's order). Pass "
                "wd_after_momentum=False."
            )
        super().__init__(
            params,
            lr=lr,
            momentum=momentum,
            dampening=dampening,
            weight_decay=weight_decay,
            nesterov=nesterov,
        )
