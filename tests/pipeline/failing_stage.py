"""A rank script for the failure tests: a 3-stage pipeline whose stage raises.

    python tests/pipeline/failing_stage.py MODE    (with torchrun's environment)

MODE: "forward" (stage 1 raises in forward of micro-batch 1), "backward" (stage 0,
on rank 0, which hosts the rendezvous store, raises in backward of micro-batch 1),
"loss" (the loss function raises on the last stage).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch
from torch import nn


class _Explode(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        raise ValueError("deliberate failure in backward")


class Fails(nn.Module):
    """Passes x through; raises on its second call (micro-batch 1) in forward or backward."""

    def __init__(self, where: str):
        super().__init__()
        self.where, self.calls = where, 0
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        self.calls += 1
        if self.calls == 2 and self.where == "forward":
            raise ValueError("deliberate failure in forward")
        x = self.lin(x)
        return _Explode.apply(x) if self.calls == 2 and self.where == "backward" else x


def main(mode: str) -> None:
    import megalith_comm as comm
    from megalith_pipeline import Pipeline

    comm.init()
    torch.manual_seed(0)
    layers = [nn.Linear(4, 4) for _ in range(3)]
    if mode in ("forward", "backward"):
        layers[1 if mode == "forward" else 0] = Fails(mode)

    def loss_fn(out, y):
        if mode == "loss":
            raise ValueError("deliberate failure in the loss")
        return (out - y).pow(2).mean()

    pipe = Pipeline(nn.Sequential(*layers), num_microbatches=3, schedule="1f1b", loss_fn=loss_fn)
    print(f"STARTING {time.time()}", flush=True)
    pipe.step(torch.randn(6, 4), torch.randn(6, 4))
    comm.barrier()
    comm.destroy()


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    main(sys.argv[1])
