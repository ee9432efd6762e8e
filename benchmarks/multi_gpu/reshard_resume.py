"""Issue 8, run 4: a checkpoint saved on N GPUs loads on another count and continues with
the loss of the uninterrupted run. The global batch is fixed; each rank trains its slice.

    torchrun --nproc_per_node 8 benchmarks/multi_gpu/reshard_resume.py --phase save --dir CK
    torchrun --nproc_per_node 4 benchmarks/multi_gpu/reshard_resume.py --phase resume --dir CK

Phase save trains --steps steps, saving model and optimizer (Booster, sharded safetensors)
after --save-at, and writes every step's loss to CK/losses.json. Phase resume loads that
checkpoint at this world size, trains the remaining steps and prints each step's loss
beside the saved run's (bf16: equal within --tol relative; fp32 on CPU: 1e-5).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

import megalith_comm as comm
from megalith import models
from megalith.booster import Booster, GeminiPlugin, LowLevelZeroPlugin


def batches(vocab: int, global_batch: int, seq: int, steps: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(7)
    return [torch.randint(0, vocab, (global_batch, seq), generator=g) for _ in range(steps)]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--phase", choices=["save", "resume"], required=True)
    ap.add_argument("--dir", required=True)
    ap.add_argument("--plugin", choices=["zero2", "gemini"], default="zero2")
    ap.add_argument("--model", default="llama-1b")
    ap.add_argument("--global-batch", type=int, default=16)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--save-at", type=int, default=4)
    ap.add_argument("--tol", type=float, default=2e-2)
    a = ap.parse_args()
    comm.init()
    world = comm.get_world()
    cuda = world.device.type == "cuda"
    precision = "bf16" if cuda else "fp32"
    plugin = (
        LowLevelZeroPlugin(stage=2, precision=precision)
        if a.plugin == "zero2"
        else GeminiPlugin(precision=precision)
    )
    booster = Booster(plugin=plugin)
    model = models.create(a.model, device=world.device, seed=0, max_seq_len=a.seq)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
    model, opt, *_ = booster.boost(model, opt)
    if a.global_batch % world.world_size:
        raise SystemExit(f"--global-batch {a.global_batch} must divide by {world.world_size}")
    rows = a.global_batch // world.world_size
    data = batches(model.unwrap().config.vocab_size, a.global_batch, a.seq, a.steps)
    ck = Path(a.dir)
    first = 0
    if a.phase == "resume":
        booster.load_model(model, str(ck / "model"))
        booster.load_optimizer(opt, str(ck / "optim"))
        first = a.save_at
    losses = []
    for step in range(first, a.steps):
        ids = data[step][world.rank * rows : (world.rank + 1) * rows].to(world.device)
        loss = model(ids, labels=ids)[0]
        booster.backward(loss, opt)
        opt.step()
        opt.zero_grad()
        t = loss.detach().double()
        comm.all_reduce(t, op="avg")
        losses.append(float(t))
        if a.phase == "save" and step + 1 == a.save_at:
            booster.save_model(model, str(ck / "model"), shard=True)
            booster.save_optimizer(opt, str(ck / "optim"), shard=True)
    if world.rank != 0:
        return
    if a.phase == "save":
        (ck / "losses.json").write_text(json.dumps({"world": world.world_size, "losses": losses}))
        print(json.dumps({"phase": "save", "world": world.world_size, "losses": losses}))
        return
    saved = json.loads((ck / "losses.json").read_text())
    want = saved["losses"][first:]
    tol = a.tol if cuda else 1e-5
    worst = max(abs(x - y) / abs(y) for x, y in zip(losses, want))
    row = {
        "phase": "resume",
        "saved_world": saved["world"],
        "world": world.world_size,
        "losses": losses,
        "uninterrupted": want,
        "worst_relative": worst,
        "ok": worst <= tol,
    }
    print(json.dumps(row))


if __name__ == "__main__":
    main()
