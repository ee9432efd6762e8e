"""DPPluginBase: ColossalAI's base class of the data-parallel plugins.

TorchDDPPlugin, LowLevelZeroPlugin, GeminiPlugin and TorchFSDPPlugin derive from it; a
user's own plugin may too. It knows the data-parallel rank and size (`rank`,
`world_size`, from megalith_comm's world, set up on first use as `launch_from_torch`
would) and builds the distributed DataLoader (`prepare_dataloader`, Plugin's, with
ColossalAI's arguments: shuffle, seed, drop_last, pin_memory, num_workers,
distributed_sampler_cls and DataLoader kwargs).
"""

from __future__ import annotations

from .base import Plugin


class DPPluginBase(Plugin):
    """Every rank is a data-parallel replica (or a shard of one ZeRO group over all ranks)."""

    def __init__(self) -> None:
        super().__init__()

    @property
    def rank(self) -> int:
        return self.dp_rank_size[0]

    @property
    def world_size(self) -> int:
        return self.dp_rank_size[1]
