"""Lent GPU: per-step losses of the 1.3B GPT under plain torch and ZeRO stages 2 and 3
(bf16), on fresh batches each step, to see stage 3 track stage 2 (they compute the same
numbers: at world 1 a gather is a copy). Run each mode in its own process:

    python -m torch.distributed.run --nproc_per_node 1 benchmarks/zero/gpu_loss_check.py --mode zero3
"""

from __future__ import annotations

import argparse
import json

import torch

import megalith_comm as comm
from megalith import models


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", choices=["torch", "zero2", "zero3", "zero3-noprefetch"])
    ap.add_argument("--model", default="gpt-1.3b")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--lr", type=float, default=3e-4)
    a = ap.parse_args()
    comm.init()
    dev = torch.device("cuda")
    model = models.create(a.model, device=dev, seed=0)
    g = torch.Generator(device=dev).manual_seed(1)
    batches = [
        torch.randint(0, 50257, (a.batch, a.seq), device=dev, generator=g) for _ in range(a.steps)
    ]
    losses = []
    if a.mode == "torch":
        opt = torch.optim.AdamW(model.parameters(), lr=a.lr, fused=True)
        for ids in batches:
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = model(ids, labels=ids)[0]
            loss.backward()
            opt.step()
            opt.zero_grad()
            losses.append(float(loss.detach()))
    else:
        import megalith_zero as zero

        cfg = zero.ZeroConfig(
            stage=int(a.mode[4]), precision="bf16", prefetch=0 if "noprefetch" in a.mode else 1
        )
        net, opt = zero.shard(model, torch.optim.AdamW(model.parameters(), lr=a.lr), cfg)
        for ids in batches:
            loss = net(ids, labels=ids)[0]
            opt.backward(loss)
            opt.step()
            opt.zero_grad()
            losses.append(float(loss.detach()))
    print(json.dumps({"mode": a.mode, "losses": [round(x, 5) for x in losses]}))


if __name__ == "__main__":
    main()
