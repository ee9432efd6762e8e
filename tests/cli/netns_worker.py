"""A rank of tests/cli/test_multinode_netns.py: data-parallel SGD on fixed-seed data.

    netns_worker.py OUT STEPS [PAUSE_S]

Every rank draws its own batch per step (seeded by step and global rank), the
gradients are averaged over all ranks with megalith_comm, and rank 0 writes the
mean loss of each step to OUT/losses.json, so any layout of the same world size
must give the same numbers. Each rank writes OUT/rank<N>.json: where it ran (its
network namespace, the source address it uses towards MASTER_ADDR, the interface
Gloo was given), and
rank 0 touches OUT/step<K> after each step so a test can act mid-run.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from pathlib import Path

import torch

import megalith_comm as comm


def source_address(master: str) -> str:
    """The local address the kernel picks to reach master (no packet is sent)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect((master, 9))
        return probe.getsockname()[0]


def main(out: Path, steps: int, pause: float) -> None:
    world = comm.init()
    master = os.environ["MASTER_ADDR"]
    where = {
        "netns": os.readlink("/proc/self/ns/net"),
        "source": source_address(master),
        "master": master,
        "gloo_interface": os.environ.get("GLOO_SOCKET_IFNAME"),
    }
    (out / f"rank{world.rank}.json").write_text(json.dumps(where))
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    losses = []
    for step in range(steps):
        data = torch.Generator().manual_seed(1000 * step + world.rank)
        x = torch.randn(16, 8, generator=data)
        y = torch.sin(x.sum(dim=1, keepdim=True))
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        for param in model.parameters():
            comm.all_reduce(param.grad, op="avg")
        mean = loss.detach().clone()
        comm.all_reduce(mean, op="avg")
        optimizer.step()
        optimizer.zero_grad()
        losses.append(mean.item())
        if world.rank == 0:
            (out / f"step{step}").touch()
        time.sleep(pause)
    if world.rank == 0:
        (out / "losses.json").write_text(json.dumps(losses))
    comm.destroy()


if __name__ == "__main__":
    pause = float(sys.argv[3]) if len(sys.argv) > 3 else 0.0
    main(Path(sys.argv[1]), int(sys.argv[2]), pause)
