"""Pipeline schedules on N GPUs (pp = N), beside torch.distributed.pipelining (issue 8 run 3,
issue 6's GPU figure).

    torchrun --nproc_per_node N benchmarks/multi_gpu/pipeline_gpu.py --out FILE.jsonl

For 1f1b, interleaved (2 chunks per rank), zb-v and gpipe at m = N, 2N and 4N
micro-batches, a step (forward + backward of every micro-batch, no optimizer) of
megalith.models' gpt-1.3b blocks (d2048, 16 heads) with 4 per rank, an 8192-token
vocabulary and an untied head, so a pass takes milliseconds on an H200 (bf16 autocast). Per (schedule, m): the median step time
from a barrier to the slowest rank's end, tokens/s, the bubble measured from the
ranks' GPU-time spans beside the simulator's bubble for the measured pass times and
the 1F1B theory (p - 1) / (m + p - 1), the fraction of the step spent waiting in
receives, and the same stages under torch.distributed.pipelining's matching schedule
over a torch NCCL group (an error string where it fails). Correctness rows: in fp32
(TF32 off) each schedule's loss and gradients against the whole model run on rank
0's device over the same data, 1e-4 relative.

On CPU ranks (Gloo) it runs a small model as a smoke test. One JSON line per row,
printed on rank 0 and appended to --out.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from contextlib import nullcontext

import torch
import torch.distributed as dist

import megalith_comm as comm
from megalith.models import GPTConfig, create, get_config
from megalith_pipeline import (
    Pipeline,
    make_schedule,
    mean_pass_times,
    measured_bubble,
    simulate,
)
from megalith_pipeline.simulator import theory_bubble_1f1b

SCHEDULES = ("1f1b", "interleaved", "zb-v", "gpipe")
CHECK_TOL = 1e-4


def gpt(preset: str, **fields) -> GPTConfig:
    """A megalith.models preset with an untied head (the stages hold no shared weight)."""
    return get_config(preset, tie_word_embeddings=False, **fields)


def bench_config(cuda: bool, n: int) -> tuple[GPTConfig, int]:
    """The timed model and its micro-batch size: on an H200 a forward pass of a stage
    (4 blocks of width 2048 over 8 x 1024 tokens, bf16) takes several ms."""
    if cuda:
        return gpt("gpt-1.3b", n_layers=4 * n, vocab_size=8192, max_seq_len=1024), 8
    small = {"d_model": 64, "d_ff": 256, "vocab_size": 512, "max_seq_len": 32}
    return gpt("gpt-tiny", n_layers=4 * n, **small), 2


def check_config(n: int) -> GPTConfig:
    return gpt("gpt-tiny", n_layers=2 * n, vocab_size=512, max_seq_len=64)


def loss_fn(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.cross_entropy(
        logits.reshape(-1, logits.shape[-1]), targets.reshape(-1)
    )


def data(c: GPTConfig, batch: int, device: torch.device, seed: int = 0) -> tuple:
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, c.vocab_size, (batch, c.max_seq_len), generator=g)
    y = torch.randint(0, c.vocab_size, (batch, c.max_seq_len), generator=g)
    return x.to(device), y.to(device)


def build(c: GPTConfig, device: torch.device) -> torch.nn.Module:
    """The same values on every rank (megalith.models seeds each parameter by its name)."""
    return create(c, device=device, seed=0)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    comm.barrier()


def timed(step, device: torch.device, warmup: int, steps: int, after=None) -> list[float]:
    """Step times from a barrier to the slowest rank's end (the barrier after it)."""
    times = []
    for i in range(warmup + steps):
        sync(device)
        t0 = time.perf_counter()
        step()
        sync(device)
        if i >= warmup:
            times.append(time.perf_counter() - t0)
            if after is not None:
                after()
    return times


def torch_peer(name: str, pipe: Pipeline, m: int, device: torch.device, group):
    """The same stages under torch.distributed.pipelining's matching schedule."""
    from torch.distributed import pipelining as tp

    stages = [
        tp.PipelineStage(pipe.stages[i], i, pipe.schedule.num_stages, device, group=group)
        for i in sorted(pipe.stages)
    ]
    if name == "1f1b":
        return tp.Schedule1F1B(stages[0], m, loss_fn=loss_fn)
    if name == "gpipe":
        return tp.ScheduleGPipe(stages[0], m, loss_fn=loss_fn)
    if name == "interleaved":
        return tp.ScheduleInterleaved1F1B(stages, m, loss_fn=loss_fn)
    return tp.ScheduleZBVZeroBubble(stages, m, loss_fn=loss_fn)


def error_text(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"


def perf_rows(args, world, device: torch.device, peer_group) -> list[dict]:
    cuda, n = device.type == "cuda", world.world_size
    c, mb = bench_config(cuda, n)
    autocast = torch.autocast("cuda", dtype=torch.bfloat16) if cuda else nullcontext()
    med = statistics.median
    rows = []
    for name in SCHEDULES:
        model = build(c, device)
        group = comm.new_group(range(n), name=f"bench_{name}", exclusive=True)
        for m in (n, 2 * n, 4 * n):
            x, y = data(c, m * mb, device)
            pipe = Pipeline(model, num_microbatches=m, schedule=name, loss_fn=loss_fn, group=group)
            stats: list = []

            def step(pipe=pipe, x=x, y=y):
                with autocast:
                    pipe.step(x, y)
                for p in pipe.module.parameters():
                    p.grad = None

            def keep(pipe=pipe, stats=stats):
                stats.append(pipe.last_stats)

            times = timed(step, device, args.warmup, args.steps, keep)
            every = [None] * n
            dist.all_gather_object(every, stats)  # every rank's StepStats, per timed step
            by_step = list(zip(*every))
            sched = make_schedule(name, n, m)
            row = {
                "kind": "perf",
                "device": torch.cuda.get_device_name(device) if cuda else "cpu",
                "pp": n,
                "schedule": name,
                "m": m,
                "micro_batch": mb,
                "seq": c.max_seq_len,
                "dim": c.d_model,
                "layers": c.n_layers,
                "precision": "bf16 autocast" if cuda else "fp32",
                "step_ms": med(times) * 1e3,
                "tokens_per_s": m * mb * c.max_seq_len / med(times),
                "bubble_measured": med(measured_bubble(st) for st in by_step),
                "bubble_simulated": med(
                    simulate(sched, mean_pass_times(st, sched.num_stages)).bubble_fraction
                    for st in by_step
                ),
                "bubble_theory_1f1b": theory_bubble_1f1b(n, m),
                "recv_wait_fraction": med(
                    sum(s.recv_wait_s for s in st) / sum(s.wall_s for s in st) for st in by_step
                ),
                "peer": "torch.distributed.pipelining",
            }
            row.update(peer_time(name, pipe, m, device, peer_group, x, y, autocast, args))
            if "peer_step_ms" in row:
                row["peer_over_megalith"] = row["peer_step_ms"] / row["step_ms"]
            rows.append(row)
            emit(row, world, args.out)
        del model
    return rows


def peer_time(name, pipe, m, device, group, x, y, autocast, args) -> dict:
    try:
        sched = torch_peer(name, pipe, m, device, group)

        def step():
            kwargs = {"target": y, "losses": []} if pipe.is_last else {}
            with autocast:
                sched.step(*((x,) if pipe.is_first else ()), **kwargs)
            for p in pipe.module.parameters():
                p.grad = None

        times = timed(step, device, args.warmup, args.steps)
        return {"peer_step_ms": statistics.median(times) * 1e3}
    except Exception as exc:  # report, do not hide, what the peer cannot run
        sync(device)
        return {"peer_error": error_text(exc)}


def correctness_rows(args, world, device: torch.device) -> list[dict]:
    """fp32, TF32 off: every schedule's loss and gradients against the whole model on rank 0."""
    n = world.world_size
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    c, m = check_config(n), 2 * n
    x, y = data(c, 2 * m, device, seed=1)
    reference = None
    if world.rank == 0:
        whole = build(c, device)
        loss = loss_fn(whole(x), y)
        loss.backward()
        reference = (loss.item(), {k: p.grad.cpu() for k, p in whole.named_parameters()})
    rows = []
    for name in SCHEDULES:
        model = build(c, device)
        group = comm.new_group(range(n), name=f"check_{name}", exclusive=True)
        pipe = Pipeline(
            model, num_microbatches=m, schedule=name, loss_fn=loss_fn, group=group,
            loss_on_all_ranks=True,
        )  # fmt: skip
        loss = pipe.step(x, y).item()
        mine = {id(p) for p in pipe.module.parameters()}
        grads = {k: p.grad.cpu() for k, p in model.named_parameters() if id(p) in mine}
        every = [None] * n
        dist.all_gather_object(every, grads)
        if world.rank == 0:
            got = {k: g for part in every for k, g in part.items()}
            ref_loss, ref_grads = reference
            grad_rel = max(
                float((got[k] - g).norm() / g.norm().clamp_min(1e-30)) for k, g in ref_grads.items()
            )
            loss_rel = abs(loss - ref_loss) / abs(ref_loss)
            row = {
                "kind": "correctness",
                "device": str(device),
                "pp": n,
                "schedule": name,
                "m": m,
                "precision": "fp32, tf32 off",
                "loss_rel": loss_rel,
                "grad_rel": grad_rel,
                "missing_grads": sorted(set(ref_grads) - set(got)),
                "ok": loss_rel <= CHECK_TOL
                and grad_rel <= CHECK_TOL
                and set(got) == set(ref_grads),
            }
            rows.append(row)
            emit(row, world, args.out)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
    return rows


def emit(row: dict, world, out: str | None) -> None:
    if world.rank != 0:
        return
    line = json.dumps(row)
    print(line, flush=True)
    if out:
        with open(out, "a") as f:
            f.write(line + "\n")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None, help="append one JSON line per row here")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--skip-perf", action="store_true", help="correctness rows only")
    args = ap.parse_args()
    comm.init()
    world = comm.get_world()
    device = world.device
    if world.world_size < 2:
        raise SystemExit("run with torchrun --nproc_per_node N, N >= 2 (pp = N)")
    # torch.distributed runs Gloo (megalith_comm.init); torch's pipelining gets NCCL on GPUs
    peer_group = dist.new_group(backend="nccl") if device.type == "cuda" else dist.group.WORLD
    t0 = time.perf_counter()
    correctness_rows(args, world, device)
    if not args.skip_perf:
        perf_rows(args, world, device, peer_group)
    emit({"kind": "done", "seconds": time.perf_counter() - t0}, world, args.out)
    comm.destroy()


if __name__ == "__main__":
    main()
