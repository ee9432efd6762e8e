"""The peer for `megalith train`'s throughput: the same model, data and optimizer in a
plain torch DDP loop (torch.optim.AdamW, no megalith on the training path).

    torchrun --nproc_per_node 2 benchmarks/train/plain_ddp.py --steps 100
Prints one JSON line on rank 0: tokens/s over the steps after the first 5.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch
import torch.distributed as dist

from megalith import models
from megalith.train import corpus as text


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--model", default="gpt-tiny")
    a = ap.parse_args()
    dist.init_process_group("gloo")
    rank, size = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // size))
    data = text.load(None, 20 * (a.seq_len + 1))
    model = models.create(a.model, device="cpu", seed=0, vocab_size=text.VOCAB)
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    other = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.1}, {"params": other, "weight_decay": 0.0}],
        lr=2e-3,
        betas=(0.9, 0.95),
    )
    times = []
    for step in range(1, a.steps + 1):
        ids = text.batch(
            data.train, a.batch_size, a.seq_len, text.batch_generator(0, step, rank, "train")
        )
        t0 = time.perf_counter()
        loss = ddp(ids, labels=ids)[0]
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad()
        logged = loss.detach().double()
        dist.all_reduce(logged)
        times.append(time.perf_counter() - t0)
    steady = times[5:]
    if rank == 0:
        tok = a.batch_size * a.seq_len * size * len(steady) / sum(steady)
        print(
            json.dumps(
                {"impl": "plain torch DDP", "tokens_per_s": tok, "loss": float(logged) / size}
            )
        )
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
