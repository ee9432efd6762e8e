"""Pipelines over NCCL on two GPUs, and receives that do not wait for the GPU's compute.

- 1F1B and interleaved 1F1B (fp32, TF32 off) give the loss and gradients of the whole
  model run on one GPU, 1e-4 relative, with a last micro-batch smaller than the others
  (a structure change mid-stream on every channel, after receives were posted early).
- A receive of a message that was already sent returns while a long kernel queued
  before it still runs: the host waits for the message, not for the compute stream
  ([Note: p2p on CUDA] in megalith_comm/p2p.py), and the data is still ordered after
  the compute on the stream.

Skipped without two CUDA GPUs.
"""

from __future__ import annotations

import time

import pytest
import torch

import megalith_comm as comm
from megalith.testing import run_distributed
from megalith_pipeline import Pipeline, as_layers
from tests.pipeline import models
from tests.pipeline.checks import _pairs

pytestmark = pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs")
RTOL = 1e-4


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-12))


def pipeline_equals_whole_model(rank: int, schedule: str) -> dict:
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    dev = comm.get_world().device
    loss_fn = torch.nn.functional.mse_loss
    ref = models.mlp(8).to(dev)
    pipe = Pipeline(models.mlp(8), num_microbatches=4, schedule=schedule, loss_fn=loss_fn)
    pipe.module.to(dev)
    worst = {"loss": 0.0, "grad": 0.0}
    for step in range(2):  # the second step starts with every structure cached
        g = torch.Generator().manual_seed(step)
        x, y = torch.randn(7, 4, generator=g).to(dev), torch.randn(7, 3, generator=g).to(dev)
        ref_loss = loss_fn(ref(x), y)
        ref_loss.backward()
        loss = pipe.step(x, y)
        if pipe.is_last:
            worst["loss"] = max(worst["loss"], rel(loss, ref_loss.detach()))
        for _, p, q in _pairs(pipe, as_layers(ref)):
            worst["grad"] = max(worst["grad"], rel(p.grad, q.grad))
        ref.zero_grad()
        pipe.module.zero_grad()
    stats = pipe.last_stats
    assert stats.spans and all(t1 >= t0 for _, _, _, t0, t1 in stats.spans)
    assert stats.start <= min(t0 for *_, t0, _ in stats.spans) <= stats.end
    return worst


@pytest.mark.timeout(240)
@pytest.mark.parametrize("schedule", ["1f1b", "interleaved"])
def test_pipeline_on_two_gpus_equals_the_whole_model(schedule):
    results = run_distributed(pipeline_equals_whole_model, 2, schedule, timeout=200, backend="nccl")
    worst = {k: max(r[k] for r in results) for k in ("loss", "grad")}
    assert max(worst.values()) <= RTOL, worst


def recv_behind_long_kernel(rank: int) -> dict:
    dev = comm.get_world().device
    comm.recv(src=0) if rank == 1 else comm.send(torch.zeros(1024, device=dev), dst=1)
    comm.barrier()  # link made, structure cached at both ends
    if rank == 0:
        comm.send(torch.full((1024,), 7.0, device=dev), dst=1)
        torch.cuda.synchronize()
        comm.barrier()
        return {}
    busy = torch.ones(1024, device=dev)
    (busy + busy).mul_(3)  # loads these kernels now: a kernel's first (lazy) load syncs the GPU
    torch.cuda.synchronize()
    start = time.perf_counter()
    torch.cuda._sleep(2_000_000_000)  # about a second of GPU time, queued on the compute stream
    busy.mul_(3)
    queued = time.perf_counter() - start
    got = comm.recv(src=0)
    returned = time.perf_counter() - start
    total = got + busy  # ordered after the sleep, on the compute stream
    torch.cuda.synchronize()
    finished = time.perf_counter() - start
    comm.barrier()
    return {
        "queued": queued,
        "returned": returned,
        "finished": finished,
        "value": total[0].item(),
        "stream": str(torch.cuda.current_stream()),
    }


@pytest.mark.timeout(120)
def test_recv_does_not_wait_for_queued_compute():
    result = run_distributed(recv_behind_long_kernel, 2, timeout=100, backend="nccl")[1]
    assert result["value"] == 10.0
    assert result["finished"] > 0.3, f"the sleep kernel was too short to tell: {result}"
    assert result["returned"] < 0.25 * result["finished"], result
