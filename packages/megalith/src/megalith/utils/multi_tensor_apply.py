"""multi_tensor_applier: calls a fused multi-tensor kernel (apex's amp_C style) in chunks.

    multi_tensor_applier(op, noop_flag, [grads, params], *args)
    # == op(multi_tensor_applier.chunk_size, noop_flag, [grads, params], *args)

megalith's own optimizers do not need it (their fused steps are in megalith_core);
it is here so that code which brings its own op (apex.amp_C, a custom extension)
runs unchanged.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch


class MultiTensorApply:
    available = True

    def __init__(self, chunk_size: int) -> None:
        self.chunk_size = chunk_size

    def check_avail(self) -> None:
        """Always available: the op that does the work is the caller's."""

    def __call__(
        self, op: Callable, noop_flag_buffer: torch.Tensor, tensor_lists: list, *args: Any
    ) -> Any:
        return op(self.chunk_size, noop_flag_buffer, tensor_lists, *args)


multi_tensor_applier = MultiTensorApply(2048 * 32)
