"""ZeroCheckpointIO for boosted optimizers whose `.optim` is the user's torch optimizer
(LowLevelZeroOptimizer, GeminiOptimizer): ZeroCheckpointIO reads megalith_zero's
ZeroOptimizer from `.optim`, so each call gets a view that shows it there."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..checkpoint_io import ZeroCheckpointIO
from ..checkpoint_io.base import Writer


class _ZeroView:
    """The boosted optimizer as ZeroCheckpointIO reads it: optim = its ZeroOptimizer."""

    def __init__(self, boosted: Any) -> None:
        self.boosted = boosted
        self.optim = boosted.zero_optimizer

    def __getattr__(self, name: str) -> Any:
        return getattr(self.boosted, name)


def _view(optimizer: Any) -> Any:
    return _ZeroView(optimizer) if hasattr(optimizer, "zero_optimizer") else optimizer


class TorchFacingZeroCheckpointIO(ZeroCheckpointIO):
    def write_optimizer(self, optimizer: Any, directory: Path, max_shard_bytes: int) -> None:
        super().write_optimizer(_view(optimizer), directory, max_shard_bytes)

    def capture_optimizer(self, optimizer: Any) -> Writer | None:
        return super().capture_optimizer(_view(optimizer))

    def read_optimizer(self, optimizer: Any, directory: Path) -> None:
        super().read_optimizer(_view(optimizer), directory)
