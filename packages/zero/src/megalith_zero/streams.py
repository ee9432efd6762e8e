"""CUDA streams by purpose. [Note: zero streams]

- reduce: gradient reductions. A chunk's reduce-scatter starts as soon as its
  gradients are complete and runs while backward computes earlier layers.
- gather: stage 3's all-gathers. The next chunks are gathered (prefetched) while
  the current module computes.
- step: with step_in_backward, a device chunk's update, as soon as its gradients are
  reduced: memory-bound, it runs beside backward's compute-bound kernels. step()
  makes the compute stream wait for it.
Each side stream first waits for the compute stream (its inputs were written
there); the Handle's wait() makes the compute stream wait for the collective.
On CPU ranks there are no streams: Gloo runs collectives on its own threads.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch


class Streams:
    def __init__(self, device: torch.device):
        cuda = device.type == "cuda"
        self.reduce = torch.cuda.Stream(device) if cuda else None
        self.gather = torch.cuda.Stream(device) if cuda else None
        self.step = torch.cuda.Stream(device) if cuda else None

    @contextlib.contextmanager
    def on(self, stream: torch.cuda.Stream | None) -> Iterator[None]:
        if stream is None:
            yield
            return
        stream.wait_stream(torch.cuda.current_stream(stream.device))
        with torch.cuda.stream(stream):
            yield
