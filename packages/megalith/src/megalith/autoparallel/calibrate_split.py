"""What a split backward (ZB-V's I and W, megalith_pipeline.backward_split) costs beyond
the gradients themselves, timed here: seconds per W frontier node and micro-batch.

megalith_pipeline's I pass walks the micro-batch's autograd graph and hooks every W
frontier node (a node on the input path with an edge into the weights-only part: a
Linear's addmm, a layer norm); its W pass is one torch.autograd.backward call per
frontier node. Each call is its own graph task, so it pays the engine's per-call set-up
and the graph walk beside the weight-gradient kernels a plain backward would run anyway.

The micro-benchmark: a stack of tiny Linear + LayerNorm layers (kernels of a few
microseconds, so the time is the calls' own), one forward and a plain backward against
the same forward and input_pass + WeightPass.run; the difference over the number of W
calls is the profile's `split_backward_call_s`. The median of a few repetitions (the
runs alternate, so load on the machine falls on both alike).
"""

from __future__ import annotations

import statistics
import time

import torch
from torch import nn

#: the micro-benchmark's layers and width: 2 frontier nodes a layer (the Linear, the norm)
LAYERS, WIDTH, ROWS = 12, 64, 16


def _stack(device: torch.device) -> nn.Module:
    layers: list[nn.Module] = []
    for _ in range(LAYERS):
        layers += [nn.Linear(WIDTH, WIDTH), nn.LayerNorm(WIDTH), nn.GELU()]
    return nn.Sequential(*layers).to(device)


def split_backward_call_s(device: torch.device, reps: int = 15) -> float:
    """Seconds a split backward adds per W frontier node and micro-batch (>= 0)."""
    from megalith_pipeline.backward_split import input_pass

    model = _stack(device)
    weights = list(model.parameters())
    x0 = torch.randn(ROWS, WIDTH, device=device)

    def plain() -> int:
        x = x0.clone().requires_grad_(True)
        torch.autograd.backward([model(x).sum()])
        return 0

    def split() -> int:
        x = x0.clone().requires_grad_(True)
        _, weight_pass = input_pass([model(x).sum()], [None], [x], weights)
        calls = len(weight_pass._calls)
        weight_pass.run()
        return calls

    def timed(fn) -> tuple[float, int]:
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        calls = fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return time.perf_counter() - start, calls

    for fn in (plain, split, plain, split):  # warm-up
        fn()
    plain_s, split_s, calls = [], [], 1
    for _ in range(reps):
        plain_s.append(timed(plain)[0])
        t, calls = timed(split)
        split_s.append(t)
    extra = statistics.median(split_s) - statistics.median(plain_s)
    return max(0.0, extra / max(1, calls))
