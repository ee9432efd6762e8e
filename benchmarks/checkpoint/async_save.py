"""The step stall of an asynchronous checkpoint against a synchronous one, same run.

A megalith.models preset is boosted under a plugin and stepped once (so every optimizer
state exists); then, alternating, `megalith train`'s save (megalith.train.state.save)
runs synchronously and asynchronously. For each: the stall (how long the save call
holds the step), and for the asynchronous one the time until its files are complete
(state.wait_saves). Every rank prints nothing; rank 0 prints a markdown table.

    # CPU, 2 ranks (the CI machine)
    megalith run --nproc_per_node 2 benchmarks/checkpoint/async_save.py --model gpt-tiny
    # the H200 box (issue 21 item 11): 1.3B and 6.7B under ZeRO-2
    megalith run --nproc_per_node 8 benchmarks/checkpoint/async_save.py \\
        --model gpt-1.3b --plugin zero2 --dir /nvme/ckpt-bench --out results.md
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import time
from pathlib import Path

import torch

import megalith_comm as comm


def _plugin(name: str, precision: str):
    from megalith.booster import GeminiPlugin, LowLevelZeroPlugin, TorchDDPPlugin

    if name == "ddp":
        return TorchDDPPlugin()
    if name in ("zero1", "zero2"):
        return LowLevelZeroPlugin(stage=int(name[-1]), precision=precision)
    return GeminiPlugin(precision=precision)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="gpt-tiny", help="a megalith.models preset")
    p.add_argument("--plugin", default="zero2", choices=["ddp", "zero1", "zero2", "gemini"])
    p.add_argument("--rounds", type=int, default=3, help="saves of each kind (alternating)")
    p.add_argument("--dir", default=None, help="where the checkpoints go (default: a temp dir)")
    p.add_argument("--out", default=None, help="also write the table to this file")
    a = p.parse_args()

    from megalith import models
    from megalith.booster import Booster
    from megalith.optim import HybridAdam
    from megalith.train import state

    world = comm.init() if not comm.is_initialized() else comm.get_world()
    device = world.device
    precision = "bf16" if device.type == "cuda" else "fp32"
    model = models.create(a.model, device=device, seed=0)
    n_params = models.num_parameters(model)
    optimizer = HybridAdam(model.parameters(), lr=1e-4)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0)
    booster = Booster(plugin=_plugin(a.plugin, precision))
    model, optimizer, _, _, scheduler = booster.boost(model, optimizer, lr_scheduler=scheduler)
    ids = torch.randint(0, 256, (1, 64), device=device)
    t0 = time.perf_counter()
    booster.backward(model(ids, labels=ids)[0], optimizer)
    optimizer.step()
    optimizer.zero_grad()
    step_s = time.perf_counter() - t0

    root = Path(a.dir or f"/tmp/megalith-async-bench-{a.model}")
    stalls: dict[str, list[float]] = {"sync": [], "async": []}
    complete: list[float] = []
    for r in range(a.rounds):
        for kind in ("sync", "async"):
            comm.barrier()
            if device.type == "cuda":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            state.save(booster, model, optimizer, scheduler, root, r, {}, use_async=kind == "async")
            stalls[kind].append(time.perf_counter() - t0)
            if kind == "async":
                state.wait_saves()
                complete.append(time.perf_counter() - t0)
    size = sum(f.stat().st_size for f in (root / f"step_{0:06d}").rglob("*") if f.is_file())
    if world.rank == 0:
        med = statistics.median
        lines = [
            f"# async vs sync checkpoint: {a.model} ({n_params / 1e9:.3f} B params), "
            f"plugin {a.plugin}, {world.world_size} x {device.type}, {precision}",
            "",
            f"checkpoint {size / 2**30:.2f} GiB; one training step {step_s:.2f} s; "
            f"medians of {a.rounds} saves each, alternating",
            "",
            "| save | step stall (s) | files complete after (s) |",
            "|---|---|---|",
            f"| sync | {med(stalls['sync']):.3f} | {med(stalls['sync']):.3f} |",
            f"| async | {med(stalls['async']):.3f} | {med(complete):.3f} |",
        ]
        text = "\n".join(lines)
        print(text, flush=True)
        if a.out:
            Path(a.out).write_text(text + "\n")
        if a.dir is None:
            shutil.rmtree(root, ignore_errors=True)
    comm.barrier()
    comm.destroy()


if __name__ == "__main__":
    main()
