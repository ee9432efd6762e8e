"""NvmeTier: the update of chunks whose optimizer states live in swap files.

Each step streams them in one pass over all param groups, so that every chunk's read
overlaps the previous chunk's update (SwapStore.stream); the update itself is the host
tier's (its stepper), waited for before the chunk's states are written back.
"""

from __future__ import annotations

from collections.abc import Sequence

from .chunk import ChunkUpdate, OffloadableChunk
from .host_tier import HostTier
from .offloader import Offloader
from .resident import swapped_states


def covers_shard(c: OffloadableChunk, pieces: list[tuple[int, slice, list[int]]]) -> bool:
    """Whether the update writes every element of the chunk's shard (the usual case)."""
    return len(pieces) == 1 and pieces[0][1] == slice(0, c.spec.shard_numel)


class NvmeTier:
    name = "nvme"
    #: a chunk's states are in memory only inside step()'s stream
    steps_in_backward = False

    def __init__(self, offloader: Offloader, host: HostTier):
        self.offloader, self.host = offloader, host

    def step(
        self, updates: Sequence[ChunkUpdate], grad_scale: float, in_backward: bool = False
    ) -> None:
        """Updates the chunks, their states read and written back around each one, in
        param-group order."""
        updates = sorted(updates, key=lambda u: u.chunk.spec.group)
        work_of = {id(u.chunk): u for u in updates}
        for c in swapped_states(self.offloader, [(u.chunk, u.names) for u in updates]):
            u = work_of[id(c)]
            # a shard in a swap file is staged beside the states, written back after
            with self.offloader.staged_params(c, read=not covers_shard(c, u.pieces)):
                self.host.submit(u, grad_scale)
                self.host.stepper.wait()  # the states are loaded only inside this loop turn

    def wait(self) -> None:
        """Nothing in flight: step() waited for every chunk."""

    def end_step(self, placed: bool) -> None:
        """Nothing to decide between steps."""

    def report(self) -> dict[str, tuple[int, int]]:
        """Swap-file bytes by "<kind>@nvme"."""
        return self.offloader.swap.report() if self.offloader.swap is not None else {}

    def reset_peak(self) -> None:
        if self.offloader.swap is not None:
            self.offloader.swap.reset_peak()

    def close(self) -> None:
        """Removes the run's swap directory (idempotent)."""
        self.offloader.close()
