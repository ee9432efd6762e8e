"""Measuring each layer's forward + backward time on a sample micro-batch (balance="time")."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from .tree import flatten, unflatten


def _detached(obj: Any) -> tuple[Any, list[torch.Tensor]]:
    """obj with its floating tensors detached and requiring grad (as a stage's inputs)."""
    tensors, spec = flatten(obj)
    leaves = [t.detach().requires_grad_(t.is_floating_point()) for t in tensors]
    return unflatten(spec, leaves), [t for t in leaves if t.requires_grad]


def layer_times(layers: Sequence[nn.Module], sample: Any, repeats: int = 3) -> list[float]:
    """Seconds per layer (median of `repeats` after one warm-up) for forward and backward.

    Runs the layers in order on `sample` as the pipeline would. Parameters' .grad
    are left untouched (gradients come from torch.autograd.grad).
    """
    runs: list[list[float]] = [[] for _ in layers]
    for rep in range(repeats + 1):
        x = sample
        for i, layer in enumerate(layers):
            x_in, leaves = _detached(x)
            start = time.perf_counter()
            y = layer(x_in)
            outs = [t for t in flatten(y)[0] if t.requires_grad]
            wrt = leaves + [p for p in layer.parameters() if p.requires_grad]
            if outs and wrt:
                torch.autograd.grad(
                    outs, wrt, [torch.ones_like(t) for t in outs], allow_unused=True
                )
            if rep:
                runs[i].append(time.perf_counter() - start)
            x = y
    return [sorted(r)[len(r) // 2] for r in runs]
