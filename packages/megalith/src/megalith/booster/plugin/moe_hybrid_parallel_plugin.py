"""ColossalAI's module path colossalai.booster.plugin.moe_hybrid_parallel_plugin.

megalith has no expert parallelism: MoeHybridParallelPlugin is HybridParallelPlugin with
ep_size=1 (the experts replicated over the data-parallel ranks, which is the same
training as ColossalAI's with ep_size=1); ep_size > 1 is refused."""

from __future__ import annotations

from typing import Any

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
        if ep_size != 1:
            raise NotImplementedError(
                f"MoeHybridParallelPlugin: ep_size={ep_size}; megalith has no expert "
                "parallelism yet: pass ep_size=1 (experts replicated over dp, the same "
                "results), or HybridParallelPlugin"
            )
        super().__init__(tp_size, pp_size, *args, **kwargs)
        self.ep_size = 1
        self.moe_dp_outside = moe_dp_outside


__all__ = ["MoeHybridParallelPlugin"]
