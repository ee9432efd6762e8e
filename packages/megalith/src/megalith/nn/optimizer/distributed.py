"""ColossalAI's Distributed* optimizers: Lamb, Adafactor, CAME and GaLore with
`setup_distributed(tp_group, dp_group, shard_to_working_param, padding_map, ...)`.

ColossalAI's versions gather per-tensor norms and factored statistics across
tensor-parallel and ZeRO shards. megalith's run the local algorithm, which is the
same algorithm exactly when no parameter is sharded: setup_distributed is accepted
for whole parameters (groups of any size whose parameters are replicated), and refuses
the sharded cases (ZeRO shards, tensor-parallel shards) by name, as does step() for a
tensor-parallel shard. DistGaloreAwamW (GaLore over bitsandbytes' 8-bit AdamW) is
refused as GaLoreAdamW8bit is.
"""

from __future__ import annotations

from typing import Any

import torch

from ._common import ParamsT, is_sharded
from .adafactor import Adafactor
from .came import CAME
from .galore import refuse_8bit
from .lamb import Lamb


def _group_size(group: Any) -> int:
    if group is None:
        return 1
    size = getattr(group, "size", None)
    if isinstance(size, int):  # megalith_comm's ProcessGroup
        return size
    import torch.distributed as dist

    return dist.get_world_size(group)


class _LocalDistributed:
    """setup_distributed for whole parameters; a clear refusal for shards."""

    local_class: str = ""
    param_groups: list[dict[str, Any]]

    def _setup(
        self,
        tp_group: Any,
        dp_group: Any,
        shard_to_working_param: dict[int, torch.Tensor] | None,
        zero: bool,
        zero_flag: str,
    ) -> None:
        owner, local = type(self).__name__, self.local_class
        self.tp_group, self.dp_group = tp_group, dp_group
        self.tp_size, self.dp_size = _group_size(tp_group), _group_size(dp_group)
        if zero and self.dp_size > 1:
            raise NotImplementedError(
                f"{owner}.setup_distributed: {zero_flag}=True with a data-parallel group of "
                f"{self.dp_size} means ZeRO shards of the parameters; megalith's {owner} steps "
                f"whole parameters only. Use {local} (or {owner}) without ZeRO (zero_stage=0, "
                f"or pass {zero_flag}=False when the parameters are whole), or an elementwise "
                "optimizer (HybridAdam) with ZeRO."
            )
        mapping = dict(shard_to_working_param or {})
        index = -1
        for group in self.param_groups:
            for p in group["params"]:
                index += 1
                working = mapping.get(id(p), p)
                if working.shape != p.shape:
                    raise NotImplementedError(
                        f"{owner}.setup_distributed: parameter {index} (shape {list(p.shape)}) is "
                        f"a shard of a working parameter of shape {list(working.shape)}; "
                        f"megalith's {owner} steps whole parameters only. Use {local} without "
                        "ZeRO, or HybridAdam with ZeRO."
                    )
                if self.tp_size > 1 and (is_sharded(p) or is_sharded(working)):
                    raise NotImplementedError(
                        f"{owner}.setup_distributed: parameter {index} (shape {list(p.shape)}) is "
                        f"a tensor-parallel shard; megalith's {owner} does not gather its norms "
                        f"across the {self.tp_size} tensor-parallel ranks. Use {local} with "
                        "tp_size=1, or HybridAdam with tensor parallelism."
                    )
        self.shard_to_working_param = {id(p): p for g in self.param_groups for p in g["params"]}
        self.is_zero = False


class DistributedLamb(_LocalDistributed, Lamb):
    """ColossalAI's DistributedLamb(params, lr, betas, eps, weight_decay, bias_correction):
    Lamb with bias_correction on by default."""

    local_class = "Lamb"

    def __init__(
        self,
        params: ParamsT,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-6,
        weight_decay: float = 0.0,
        bias_correction: bool = True,
    ) -> None:
        super().__init__(
            params,
            lr=lr,
            betas=betas,
            eps=eps,
            weight_decay=weight_decay,
            bias_correction=bias_correction,
        )
        self.tp_size = self.dp_size = 1

    def setup_distributed(
        self,
        tp_group: Any = None,
        dp_group: Any = None,
        shard_to_working_param: dict[int, torch.Tensor] | None = None,
        padding_map: dict[int, int] | None = None,
        is_zero: bool = False,
    ) -> None:
        self._setup(tp_group, dp_group, shard_to_working_param, is_zero, "is_zero")


class DistributedAdaFactor(_LocalDistributed, Adafactor):
    """ColossalAI's DistributedAdaFactor: Adafactor's arguments and rule."""

    local_class = "Adafactor"

    def __init__(self, params: ParamsT, *args: Any, **kwargs: Any) -> None:
        super().__init__(params, *args, **kwargs)
        self.tp_size = self.dp_size = 1

    def setup_distributed(
        self,
        tp_group: Any = None,
        dp_group: Any = None,
        shard_to_working_param: dict[int, torch.Tensor] | None = None,
        padding_map: dict[int, int] | None = None,
        use_zero: bool = True,
    ) -> None:
        self._setup(tp_group, dp_group, shard_to_working_param, use_zero, "use_zero")


class DistributedCAME(_LocalDistributed, CAME):
    """ColossalAI's DistributedCAME: CAME's arguments and rule."""

    local_class = "CAME"

    def __init__(self, params: ParamsT, *args: Any, **kwargs: Any) -> None:
        super().__init__(params, *args, **kwargs)
        self.tp_size = self.dp_size = 1

    def setup_distributed(
        self,
        tp_group: Any = None,
        dp_group: Any = None,
        shard_to_working_param: dict[int, torch.Tensor] | None = None,
        padding_map: dict[int, int] | None = None,
        use_zero: bool = True,
    ) -> None:
        self._setup(tp_group, dp_group, shard_to_working_param, use_zero, "use_zero")


class DistGaloreAwamW(torch.optim.Optimizer):
    """ColossalAI's DistGaloreAwamW (GaLoreAdamW8bit with tensor parallelism and ZeRO):
    refused, as GaLoreAdamW8bit is (bitsandbytes' 8-bit states)."""

    def __init__(
        self,
        params: ParamsT,
        lr: float = 1e-2,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 1e-2,
        nbits: int = 8,
        min_8bit_size: int = 4096,
        percentile_clipping: int = 100,
        block_wise: bool = True,
        is_paged: bool = False,
        args: Any = None,
    ) -> None:
        refuse_8bit(type(self).__name__)
