"""ColossalAI's MoeHybridParallelPlugin (colossalai.booster.plugin.moe_hybrid_parallel_plugin):
HybridParallelPlugin with expert parallelism.

The data-parallel ranks split into ep_size ranks that divide each MoE layer's experts
among them (megalith.moe: tokens go to their experts' rank and back, two all_to_alls per
layer and pass) times moe_dp_size = dp_size / ep_size replicas of that split. A dense
weight is averaged over every dp rank as in HybridParallelPlugin; an expert weight over
the moe_dp ranks that hold the same experts, its gradient already the sum of what every
rank of its ep group sent it. The files (MoECheckpointIO) hold every expert, as
transformers writes them.

What runs: transformers' MoE models whose experts compute as Mixtral's (Mixtral,
Qwen2-MoE, Qwen3-MoE, DeepSeek-V2/V3, OLMoE, ...; megalith.moe.experts), ep_size > 1 with
tp_size = 1, pp_size = 1, no sequence parallelism, zero_stage 0 or 1 (moe_zero.py: ZeRO
over the dense weights, a plain optimizer of the user's class over the experts; fp32 or
bf16); each of the others with ep_size > 1 is refused, naming what to pass. zero_stage=2
becomes 1 with a one-time warning at any ep_size, as ColossalAI's plugin does. ep_size=1
is HybridParallelPlugin with every other argument, the experts held whole on every rank
(their gradients zeros where a rank routed nothing to them, so every rank reduces the
same tensors).
"""

from __future__ import annotations

import warnings
from typing import Any

import torch

from ..checkpoint_io.base import CheckpointIO
from .base import world
from .hybrid import HybridParallelPlugin


class MoeHybridParallelPlugin(HybridParallelPlugin):
    def __init__(
        self,
        tp_size: int,
        pp_size: int = 1,
        ep_size: int = 1,
        *args: Any,
        moe_dp_outside: bool = True,
        **kwargs: Any,
    ) -> None:
        if not isinstance(ep_size, int) or isinstance(ep_size, bool) or ep_size < 1:
            raise ValueError(
                f"MoeHybridParallelPlugin: ep_size must be an int >= 1, got {ep_size!r}"
            )
        self.ep_size = ep_size
        self.moe_dp_outside = bool(moe_dp_outside)
        self.moe_mesh: Any = None
        if kwargs.get("zero_stage") == 2:  # as ColossalAI's plugin
            _warn_stage_2()
            kwargs["zero_stage"] = 1
        if ep_size > 1:
            _refuse_with_ep(ep_size, tp_size, pp_size, kwargs)
        super().__init__(tp_size, pp_size, *args, **kwargs)

    # -- groups ---------------------------------------------------------------------
    @property
    def moe_dp_size(self) -> int:
        return self._dp() // self.ep_size

    def _build_mesh(self) -> None:
        import megalith_comm as comm

        if self.mesh is not None:
            return
        dp = self._dp()
        if dp % self.ep_size:
            raise ValueError(
                f"MoeHybridParallelPlugin: ep_size={self.ep_size} does not divide the "
                f"{dp} data-parallel ranks (world {world().world_size} / (tp {self.tp_size} "
                f"x pp {self.pp_size} x sp {self.sp_size})); pass an ep_size that divides {dp}"
            )
        super()._build_mesh()
        # dp rank = moe_dp rank x ep + ep rank: the same ranks as the hybrid mesh's dp axis
        self.moe_mesh = comm.Mesh(
            world(), moe_dp=dp // self.ep_size, ep=self.ep_size, sp=self.sp_size,
            tp=self.tp_size, name="moe",
        )  # fmt: skip

    @property
    def ep_group(self) -> Any:
        """This rank's expert-parallel torch.distributed group."""
        return self._torch_group("ep")

    @property
    def moe_dp_group(self) -> Any:
        """The ranks holding the same experts as this one (torch.distributed group)."""
        return self._torch_group("moe_dp")

    def _torch_group(self, axis: str) -> Any:
        self._build_mesh()
        if self.moe_mesh.size(axis) == 1:
            return self._pg_mesh.single_group()
        return self.moe_mesh.group(axis).gloo

    # -- boost ----------------------------------------------------------------------
    def configure(self, model, optimizer, criterion, dataloader, lr_scheduler):
        from megalith.moe import validate_experts
        from megalith.tensor_parallel.lora import peft_base

        if self.ep_size > 1:
            validate_experts(peft_base(model), self.ep_size)  # before any collective
        return super().configure(model, optimizer, criterion, dataloader, lr_scheduler)

    def _shard_experts(self, model: torch.nn.Module) -> None:
        from megalith.moe import apply_expert_parallel

        mesh = self.moe_mesh
        apply_expert_parallel(model, mesh.group("ep"), mesh.group("moe_dp"), self.mesh.group("dp"))

    def _zero(self, model, optimizer, criterion, dataloader, lr_scheduler):
        if self.ep_size == 1:
            return super()._zero(model, optimizer, criterion, dataloader, lr_scheduler)
        from .moe_zero import zero_beside_experts

        wrapped, opt = zero_beside_experts(self, model, optimizer)
        return wrapped, opt, criterion, dataloader, lr_scheduler

    def get_checkpoint_io(self) -> CheckpointIO:
        if self.ep_size == 1:
            return super().get_checkpoint_io()
        if self.zero_stage:
            from ..checkpoint_io.moe_zero import MoEZeroCheckpointIO

            return MoEZeroCheckpointIO()
        from ..checkpoint_io.moe import MoECheckpointIO

        return MoECheckpointIO()


_warned_stage_2 = False


def _warn_stage_2() -> None:
    global _warned_stage_2
    if not _warned_stage_2:
        _warned_stage_2 = True
        warnings.warn(
            "MoeHybridParallelPlugin: zero_stage=2 runs as zero_stage=1 (ColossalAI's plugin "
            "does the same); pass zero_stage=1 to silence this",
            stacklevel=3,
        )


def _refuse_with_ep(ep: int, tp: int, pp: int, kwargs: dict[str, Any]) -> None:
    """What expert parallelism does not run beside yet, before any collective."""
    what = f"MoeHybridParallelPlugin(ep_size={ep})"
    if tp != 1:
        raise ValueError(
            f"{what} with tp_size={tp}: experts split beside tp are not built; pass tp_size=1"
        )
    if pp != 1:
        raise ValueError(f"{what} with pp_size={pp}: pass pp_size=1")
    if kwargs.get("zero_stage") and kwargs.get("precision") == "fp16":
        raise ValueError(
            f"{what} with zero_stage=1 and precision='fp16': the experts' gradients are not "
            "loss-scaled beside ZeRO's; pass precision='bf16' (as ColossalAI's MoE examples) "
            "or zero_stage=0"
        )
    if kwargs.get("enable_sequence_parallelism") or (kwargs.get("sp_size") or 1) > 1:
        raise ValueError(
            f"{what} with sequence parallelism: pass enable_sequence_parallelism=False"
        )
    if kwargs.get("cpu_offload"):
        raise ValueError(f"{what} with cpu_offload=True: pass cpu_offload=False")


__all__ = ["MoeHybridParallelPlugin"]
