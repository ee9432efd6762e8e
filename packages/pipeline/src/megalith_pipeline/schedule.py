"""Schedules: for each pipeline rank, the ordered list of passes it runs in one step.

A model is cut into `num_stages` consecutive stages (pp ranks x `chunks` virtual
stages per rank). A schedule places the stages on ranks and orders, on each rank,
the passes of every micro-batch:

- F(s, mb): forward of stage s on micro-batch mb;
- B(s, mb): its whole backward (input and weight gradients together);
- I(s, mb) then W(s, mb): the same backward split in two (zero-bubble schedules):
  I computes the gradient of the stage's inputs, which the previous stage waits
  for; W computes the weight gradients later, filling what would be a bubble.

The order on each rank is fixed before the step, identical on every rank, and
checked by the simulator (simulator.py) to complete: sends never block
(megalith_comm's async send), so a rank only ever waits for a receive whose send
an earlier pass of another rank issues.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

FORWARD, BACKWARD, INPUT_GRAD, WEIGHT_GRAD = "F", "B", "I", "W"


class Action(NamedTuple):
    kind: str  # F, B, I or W
    stage: int
    mb: int

    def __repr__(self) -> str:
        return f"{self.kind}({self.stage},{self.mb})"


@dataclass(frozen=True)
class Schedule:
    """Stage placement and per-rank pass order for one step.

    placement[s] is the pp rank of stage s; orders[r] the passes rank r runs,
    in order. Built by make_schedule (schedules.py); valid by construction.
    """

    name: str
    pp: int
    num_microbatches: int
    chunks: int
    placement: tuple[int, ...]
    orders: tuple[tuple[Action, ...], ...]

    @property
    def num_stages(self) -> int:
        return len(self.placement)

    @property
    def splits_backward(self) -> bool:
        return any(a.kind == INPUT_GRAD for order in self.orders for a in order)

    def rank_of(self, stage: int) -> int:
        return self.placement[stage]

    def stages_of(self, rank: int) -> tuple[int, ...]:
        """The stages on `rank`, ascending; a stage's chunk index is its position here."""
        return tuple(s for s, r in enumerate(self.placement) if r == rank)

    def chunk_of(self, stage: int) -> int:
        return self.stages_of(self.placement[stage]).index(stage)

    def actions(self, rank: int) -> tuple[Action, ...]:
        return self.orders[rank]

    @property
    def last_rank(self) -> int:
        """The rank that computes the loss."""
        return self.placement[-1]

    def __str__(self) -> str:
        return (
            f"{self.name} (pp {self.pp}, {self.num_microbatches} micro-batches, "
            f"{self.chunks} chunk(s) per rank)"
        )


def interleaved_placement(pp: int, chunks: int) -> tuple[int, ...]:
    """Stage s on rank s % pp: each rank holds every pp-th stage (Megatron's interleaving)."""
    return tuple(s % pp for s in range(pp * chunks))


def check_counts(name: str, pp: int, num_microbatches: int, chunks: int) -> None:
    """ValueError naming the numbers for counts no schedule can run."""
    for label, value in (("pp", pp), ("num_microbatches", num_microbatches), ("chunks", chunks)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"schedule {name!r}: {label}={value!r}; expected an integer >= 1")
