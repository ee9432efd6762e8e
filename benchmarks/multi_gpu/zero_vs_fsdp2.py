"""Issue 8, runs 2 and 5: ZeRO-2 and ZeRO-3 training of a Llama-style model in bf16 on
every GPU of the host, beside torch FSDP2 (fully_shard per block and at the root, bf16
parameters and fp32 gradient reduction) on the same model, batch and data; and the same
model tensor-parallel over every GPU (HybridParallelPlugin, with and without sequence
parallelism; the group trains one batch of --batch sequences, whose tokens per second
are divided by the GPUs, so every mode reports tokens/s per GPU). hybrid is
HybridParallelPlugin's --tp x --pp x dp layout (dp the rest of the world, ZeRO-1 over
it): each replica of tp x pp GPUs trains --batch sequences per step in --microbatches
micro-batches (1F1B), its tokens/s divided by its GPUs. zero2-early and
zero3-early update each chunk during backward (ZeroConfig.step_in_backward: nothing here
clips); zero2-overlap also leaves the parameter all-gathers to the next forward
(overlap_param_gather). compute is the floor of them all: the bf16 forward and backward
alone, with no communication and no optimizer. One mode per process:

    torchrun --nproc_per_node 2 benchmarks/multi_gpu/zero_vs_fsdp2.py --mode zero2 \
        --model llama-7b --batch 4 --seq 2048 --ckpt --out $OUT/zero2.json

Prints and writes one JSON line: tokens/s per GPU, MFU (megalith.models.counting, against
989 TFLOP/s dense bf16 per H200 unless --peak says otherwise), the step time, the peak
device memory (the device's own count: torch's and the engine's allocators) and the
losses, which must fall and agree between modes. On CPU ranks (Gloo) it runs as a smoke
test of the script (--model llama-tiny).
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import dataclass
from pathlib import Path

import torch

import megalith_comm as comm
from megalith import models
from megalith.models.counting import mfu


@dataclass(frozen=True)
class Layout:
    """--mode hybrid: tensor- and pipeline-parallel sizes (data parallel is the rest of
    the world) and the micro-batches each pipeline step splits its batch into."""

    tp: int = 1
    pp: int = 1
    microbatches: int = 4


def build_step(mode: str, model: torch.nn.Module, lr: float, layout: Layout = Layout()):
    if mode in ("zero2", "zero3", "zero2-early", "zero3-early", "zero2-overlap"):
        import megalith_zero as zero

        net, opt = zero.shard(
            model,
            torch.optim.AdamW(model.parameters(), lr=lr),
            zero.ZeroConfig(
                stage=int(mode[4]),
                precision="bf16",
                step_in_backward=mode.endswith(("-early", "-overlap")),
                overlap_param_gather=mode.endswith("-overlap"),
            ),
        )

        def step(ids):
            loss = net(ids, labels=ids)[0]
            opt.backward(loss)
            opt.step()
            opt.zero_grad()
            return loss

        return step
    if mode == "fsdp2":
        import torch.distributed as dist
        from torch.distributed.device_mesh import DeviceMesh
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        # megalith_comm.init() set up torch.distributed with Gloo; FSDP2 on GPUs gets a
        # group of torch's NCCL over the same ranks
        cuda = next(model.parameters()).is_cuda
        group = dist.new_group(backend="nccl") if cuda else dist.group.WORLD
        mesh = DeviceMesh.from_group(group, "cuda" if cuda else "cpu")
        policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        for block in model.blocks:
            fully_shard(block, mesh=mesh, mp_policy=policy)
        fully_shard(model, mesh=mesh, mp_policy=policy)
        opt = torch.optim.AdamW(model.parameters(), lr=lr, fused=torch.cuda.is_available())

        def step(ids):
            loss = model(ids, labels=ids)[0]
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            return loss

        return step
    if mode == "compute":
        # the floor of every data-parallel mode: bf16 forward and backward of the same
        # model and batch with no communication and no optimizer (each rank on its own)
        model.to(torch.bfloat16)

        def step(ids):
            loss = model(ids, labels=ids)[0]
            loss.backward()
            for p in model.parameters():
                p.grad = None
            return loss

        return step
    if mode in ("tp", "tp-sp"):  # tensor parallel over every GPU (issue 8, run 5)
        from megalith.booster import Booster
        from megalith.booster.plugin import HybridParallelPlugin

        world = comm.get_world().world_size
        plugin = HybridParallelPlugin(
            tp_size=world, precision="bf16", enable_sequence_parallelism=mode == "tp-sp"
        )
        booster = Booster(plugin=plugin)
        opt = torch.optim.AdamW(model.parameters(), lr=lr, fused=torch.cuda.is_available())
        net, opt, *_ = booster.boost(model, opt)

        def step(ids):
            loss = net(ids, labels=ids)[0]
            booster.backward(loss, opt)
            opt.step()
            opt.zero_grad()
            return loss

        return step
    if mode == "hybrid":  # HybridParallelPlugin tp x pp x dp (issue 8, run 5 on 8 GPUs)
        from megalith.booster import Booster
        from megalith.booster.plugin import HybridParallelPlugin

        plugin = HybridParallelPlugin(
            tp_size=layout.tp,
            pp_size=layout.pp,
            num_microbatches=layout.microbatches,
            zero_stage=1,
            precision="bf16",
        )
        booster = Booster(plugin=plugin)
        opt = torch.optim.AdamW(model.parameters(), lr=lr, fused=torch.cuda.is_available())
        net, opt, *_ = booster.boost(model, opt)
        dp_group = plugin.mesh.group("dp")

        def step(ids):
            batch = {"input_ids": ids, "labels": ids}
            out = booster.execute_pipeline(iter([batch]), net, lambda o, _: o.loss, opt)
            opt.step()
            opt.zero_grad()
            loss = out["loss"].detach().reshape(1).float()  # the batch's, on every rank
            comm.all_reduce(loss, op="avg", group=dp_group)
            return loss[0]

        step.dp_rank = plugin.dp_rank_size[0]
        return step
    raise ValueError(
        f"--mode {mode!r}: expected zero2, zero3, zero2-early, zero3-early, zero2-overlap, "
        "fsdp2, tp, tp-sp, hybrid, compute"
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", required=True)
    ap.add_argument("--model", default="llama-7b")
    ap.add_argument("--batch", type=int, default=4, help="sequences per GPU per step")
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--ckpt", action="store_true", help="activation checkpointing")
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--tp", type=int, default=2, help="--mode hybrid: tensor-parallel size")
    ap.add_argument("--pp", type=int, default=2, help="--mode hybrid: pipeline stages")
    ap.add_argument(
        "--microbatches", type=int, default=4, help="--mode hybrid: micro-batches per step"
    )
    ap.add_argument("--peak", type=float, default=989e12, help="peak FLOP/s per device")
    ap.add_argument("--out", default="")
    ap.add_argument(
        "--profile", default="", help="a folder: one more step under torch.profiler (CUDA)"
    )
    a = ap.parse_args()
    comm.init()
    world = comm.get_world()
    dev = world.device
    cuda = dev.type == "cuda"
    model = models.create(
        a.model, device=dev, seed=0, activation_checkpointing=a.ckpt, max_seq_len=max(a.seq, 8)
    )
    step = build_step(a.mode, model, a.lr, Layout(a.tp, a.pp, a.microbatches))
    # each rank its own data; under tp every rank of the group the same, under hybrid
    # every rank of a data-parallel replica (tp x pp GPUs) the same
    same = a.mode.startswith("tp")
    replica = getattr(step, "dp_rank", 0 if same else world.rank)
    g = torch.Generator(device=dev).manual_seed(1000 + replica)
    vocab = model.config.vocab_size
    batches = [torch.randint(0, vocab, (a.batch, a.seq), device=dev, generator=g) for _ in range(2)]
    losses = []
    for i in range(a.warmup):
        losses.append(float(step(batches[i % 2]).detach()))
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    comm.barrier()
    t0 = time.perf_counter()
    for i in range(a.steps):
        losses.append(float(step(batches[i % 2]).detach()))
    if cuda:
        torch.cuda.synchronize()
    comm.barrier()
    dt = (time.perf_counter() - t0) / a.steps
    profiled = None
    if a.profile and cuda:  # after the timing, so it does not slow the timed steps
        from profile_step import profile_step

        path = Path(a.profile) / f"{a.mode}_rank{world.rank}.txt"
        path.parent.mkdir(parents=True, exist_ok=True)
        kinds = profile_step(lambda: step(batches[0]), path)
        profiled = {k: round(v, 4) for k, v in kinds.items()}
    # under tp the whole group trains one batch, under hybrid each replica of tp x pp
    # GPUs: its tokens are shared by the GPUs
    share = world.world_size if same else a.tp * a.pp if a.mode == "hybrid" else 1
    tps = a.batch * a.seq / dt / share
    free, total = torch.cuda.mem_get_info() if cuda else (0, 0)
    row = {
        "mode": a.mode,
        "model": a.model,
        "world": world.world_size,
        "batch_per_gpu": a.batch,
        **({"tp": a.tp, "pp": a.pp, "microbatches": a.microbatches} if a.mode == "hybrid" else {}),
        "seq": a.seq,
        "ckpt": a.ckpt,
        "tokens_per_s_per_gpu": round(tps, 1),
        "mfu": round(mfu(tps, model.config, a.peak, a.seq), 4),
        "step_s": round(dt, 4),
        "torch_peak_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2) if cuda else 0.0,
        "device_used_gib": round((total - free) / 2**30, 2),
        "losses": [round(x, 4) for x in losses],
        **({"profile_s": profiled} if profiled else {}),
        "device": torch.cuda.get_device_name() if cuda else "cpu",
        "date": time.strftime("%Y-%m-%d %H:%M"),
    }
    if world.rank == 0:
        print(json.dumps(row), flush=True)
        if a.out:
            with open(a.out, "a") as f:
                f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
