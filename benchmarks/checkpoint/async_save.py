"""The step stall of an asynchronous checkpoint against a synchronous one, same run.

A megalith.models preset is boosted under a plugin and stepped (so every optimizer
state exists); then `megalith train`'s save (megalith.train.state.save) runs
synchronously, then asynchronously, each followed by a training step. For each: the
stall (the save call, and until the GPU is idle again), the next step, and the time
until its files are complete (state.wait_saves). Rank 0 prints a markdown table.

    # CPU, 2 ranks (the CI machine)
    megalith run --nproc_per_node 2 benchmarks/checkpoint/async_save.py --model gpt-tiny
    # the H200 box (issue 21 item 11): 1.3B under ZeRO-2; 6.7B with host offload, whose
    # 90 GB checkpoint is larger than the box's disk (--sink discard)
    megalith run --nproc_per_node 1 benchmarks/checkpoint/async_save.py \\
        --model gpt-1.3b --plugin zero2 --rounds 2 --dir /tmp/ckpt-bench --out results.md
    megalith run --nproc_per_node 1 benchmarks/checkpoint/async_save.py \\
        --model gpt-6.7b --plugin zero2 --offload --sink discard --rounds 2

The first asynchronous save pins its host memory (once per run); the later ones reuse it.
"next step" is the training step right after the save: with state read in place
(zero_capture.py) it waits there for the writer.
"""

from __future__ import annotations

import argparse
import shutil
import time
from pathlib import Path

import torch

import megalith_comm as comm


def _plugin(name: str, precision: str, offload: bool):
    from megalith.booster import GeminiPlugin, LowLevelZeroPlugin, TorchDDPPlugin

    if name == "ddp":
        return TorchDDPPlugin()
    if name in ("zero1", "zero2"):
        return LowLevelZeroPlugin(stage=int(name[-1]), precision=precision, cpu_offload=offload)
    return GeminiPlugin(precision=precision, offload_optim_frac=1.0 if offload else 0.0)


class DiscardSink:
    """safetensors' writer that serialises each file in memory (headers and all) and keeps
    an empty file in its place: the saves' own work without the disk (for a checkpoint
    larger than the disk)."""

    def __init__(self) -> None:
        import safetensors.torch as st

        self.st = st
        self.bytes = 0

    def save_file(self, tensors, filename, metadata=None) -> None:
        self.bytes += len(self.st.save(tensors, metadata=metadata))
        Path(filename).touch()


def _use_discard_sink() -> DiscardSink:
    import megalith_core.safetensors_files as files

    sink = DiscardSink()
    reader = files._st()[1]
    files._st = lambda: (sink, reader)
    return sink


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="gpt-tiny", help="a megalith.models preset")
    p.add_argument("--plugin", default="zero2", choices=["ddp", "zero1", "zero2", "gemini"])
    p.add_argument("--offload", action="store_true", help="masters and states in host memory")
    p.add_argument("--rounds", type=int, default=3, help="asynchronous saves")
    p.add_argument("--sync-rounds", type=int, default=1, help="synchronous saves")
    p.add_argument("--sink", default="disk", choices=["disk", "discard"], help="see DiscardSink")
    p.add_argument("--dir", default=None, help="where the checkpoints go (default: a temp dir)")
    p.add_argument("--out", default=None, help="also write the table to this file")
    a = p.parse_args()

    from megalith import models
    from megalith.booster import Booster
    from megalith.booster.checkpoint_io import pinned_pool, zero_capture
    from megalith.optim import HybridAdam
    from megalith.train import state

    sink = _use_discard_sink() if a.sink == "discard" else None
    world = comm.init() if not comm.is_initialized() else comm.get_world()
    device = world.device
    precision = "bf16" if device.type == "cuda" else "fp32"
    model = models.create(a.model, device=device, seed=0)
    n_params = models.num_parameters(model)
    optimizer = HybridAdam(model.parameters(), lr=1e-4)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0)
    booster = Booster(plugin=_plugin(a.plugin, precision, a.offload))
    model, optimizer, _, _, scheduler = booster.boost(model, optimizer, lr_scheduler=scheduler)
    ids = torch.randint(0, 256, (1, 64), device=device)

    def step() -> float:
        _sync()
        t0 = time.perf_counter()
        booster.backward(model(ids, labels=ids)[0], optimizer)
        optimizer.step()
        optimizer.zero_grad()
        _sync()
        return time.perf_counter() - t0

    step()  # every optimizer state exists from here on
    step_s = step()

    root = Path(a.dir or f"/tmp/megalith-async-bench-{a.model}")
    rows = []
    kinds = ["sync"] * a.sync_rounds + ["async"] * a.rounds
    for r, kind in enumerate(kinds):
        comm.barrier()
        _sync()
        written = sink.bytes if sink else 0
        t0 = time.perf_counter()
        state.save(booster, model, optimizer, scheduler, root, r, {}, use_async=kind == "async")
        returned = time.perf_counter() - t0
        _sync()
        stall = time.perf_counter() - t0
        zero_capture.last_step_wait_s = 0.0
        next_step = step()
        waited = zero_capture.last_step_wait_s
        state.wait_saves()
        rows.append((kind, returned, stall, next_step, waited, time.perf_counter() - t0))
        if world.rank == 0:  # as it comes: a run cut off by its time limit keeps these
            print(f"row {r} {kind}: stall {stall:.3f} s, complete {rows[-1][-1]:.2f} s", flush=True)
        written = (sink.bytes if sink else 0) - written
    if sink:
        size, where = written, "serialised to memory and discarded (DiscardSink)"
    else:
        files = (root / f"step_{0:06d}").rglob("*")
        size, where = sum(f.stat().st_size for f in files if f.is_file()), f"written to {root}"
    pinned = sum(r.allocated for r in pinned_pool._regions.values())
    if world.rank == 0:
        lines = [
            f"# async vs sync checkpoint: {a.model} ({n_params / 1e9:.3f} B params), plugin "
            f"{a.plugin}{' with host offload' if a.offload else ''}, {world.world_size} x "
            f"{device.type}, {precision}",
            "",
            f"checkpoint {size / 2**30:.2f} GiB {where}; one training step {step_s:.2f} s; "
            f"pinned host memory allocated over the run {pinned / 2**30:.2f} GiB",
            "",
            "| # | save | call returns (s) | step stall, GPU idle again (s) | next step (s) "
            "| of it, waiting for the writer (s) | files complete after (s) |",
            "|---|---|---|---|---|---|---|",
        ]
        for i, (kind, returned, stall, nxt, waited, done) in enumerate(rows):
            lines.append(
                f"| {i} | {kind} | {returned:.3f} | {stall:.3f} | {nxt:.2f} | {waited:.2f} "
                f"| {done:.2f} |"
            )
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
