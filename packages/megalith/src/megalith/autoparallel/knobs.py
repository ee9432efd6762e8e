"""Knobs: one point of the planner's search space (what a Candidate is, before scoring).

The rank layout is Megatron's and torchtitan's: tp innermost (consecutive ranks, so a
tp group stays inside a node), then sp, then dp, with pp outermost. So a dp group's
members are tp * sp ranks apart and a pipeline neighbour world / pp ranks away.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

SCHEDULES = ("none", "1f1b", "interleaved", "zbv")
OFFLOADS = ("none", "host", "host+nvme")
#: virtual pipeline stages (model chunks) per rank of each schedule
CHUNKS = {"none": 1, "1f1b": 1, "interleaved": 2, "zbv": 2}
#: the planner's schedule names -> megalith_pipeline's
PIPELINE_NAMES = {"1f1b": "1f1b", "interleaved": "interleaved", "zbv": "zb-v"}


@dataclass(frozen=True)
class Knobs:
    """dp x tp x pp x sp ranks, ZeRO stage, offloaded share of the optimizer state,
    micro-batch (sequences) x micro-batches per step per dp rank, the checkpointed share
    of layers, the pipeline schedule, the training precision."""

    dp: int = 1
    tp: int = 1
    pp: int = 1
    sp: int = 1
    zero_stage: int = 0
    offload: str = "none"
    offload_fraction: float = 0.0
    micro_batch: int = 1
    num_microbatches: int = 1
    ckpt: float = 0.0
    schedule: str = "none"
    precision: str = "bf16"

    def __post_init__(self) -> None:
        for name in ("dp", "tp", "pp", "sp", "micro_batch", "num_microbatches"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"Knobs: {name}={value!r}; expected an int >= 1")
        if self.zero_stage not in (0, 1, 2, 3):
            raise ValueError(f"Knobs: zero_stage={self.zero_stage!r}; expected 0, 1, 2 or 3")
        if self.offload not in OFFLOADS:
            raise ValueError(f"Knobs: offload={self.offload!r}; expected one of {OFFLOADS}")
        if not 0.0 <= self.offload_fraction <= 1.0 or not 0.0 <= self.ckpt <= 1.0:
            raise ValueError(
                f"Knobs: offload_fraction={self.offload_fraction}, ckpt={self.ckpt}; "
                "both are shares in [0, 1]"
            )
        if (self.offload == "none") != (self.offload_fraction == 0.0):
            raise ValueError(
                f"Knobs: offload={self.offload!r} with offload_fraction="
                f"{self.offload_fraction}; give both (offload 'host' and a share > 0) or neither"
            )
        if self.schedule not in SCHEDULES or (self.pp > 1) == (self.schedule == "none"):
            raise ValueError(
                f"Knobs: schedule={self.schedule!r} with pp={self.pp}; pp > 1 takes '1f1b', "
                "'interleaved' or 'zbv', pp = 1 takes 'none'"
            )

    @property
    def world(self) -> int:
        return self.dp * self.tp * self.pp * self.sp

    @property
    def chunks(self) -> int:
        """Model chunks (virtual stages) per pipeline rank."""
        return CHUNKS[self.schedule]

    @property
    def sequences_per_step(self) -> int:
        """Sequences of one optimizer step, over all dp ranks."""
        return self.dp * self.micro_batch * self.num_microbatches

    def fields(self) -> dict[str, Any]:
        return asdict(self)

    def fields_without_precision(self) -> dict[str, Any]:
        """The fields a Candidate has (it does not carry the precision)."""
        out = asdict(self)
        del out["precision"]
        return out
