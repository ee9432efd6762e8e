"""TorchDDPPlugin's failures say what happened: a rank that dies or hangs inside DDP's
backward is named with the op (as megalith_comm's own collectives do), and a model on the
meta device gets what to do instead of torch's "Tensor.item() cannot be called on meta
tensors".

The dead/hung rank cases run plain rank processes with torchrun's environment (this file
is the rank script: `python test_ddp_diagnosis.py MODE`), so what is checked is what a user
sees on the surviving rank.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from megalith.testing import free_port, run_distributed

WORLD = 2
FAIL_RANK = 1


def _run_pair(mode: str, timeout_s: float) -> list[tuple[int, str, str]]:
    """Starts WORLD rank processes; returns [(rc, stdout, stderr)] in rank order."""
    env = {
        **os.environ,
        "WORLD_SIZE": str(WORLD),
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(free_port()),
        "MEGALITH_COMM_TIMEOUT": str(timeout_s),
        "OMP_NUM_THREADS": "1",
    }
    procs = [
        subprocess.Popen(
            [sys.executable, __file__, mode],
            env={**env, "RANK": str(r), "LOCAL_RANK": str(r)},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for r in range(WORLD)
    ]
    out = []
    try:
        for rank, p in enumerate(procs):
            try:
                stdout, stderr = p.communicate(timeout=60 if rank != FAIL_RANK else 5)
            except subprocess.TimeoutExpired:  # the hung rank: the survivor is what we check
                p.kill()
                stdout, stderr = p.communicate()
            out.append((p.returncode, stdout, stderr))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    return out


def _verdict(stdout: str) -> dict:
    for line in stdout.splitlines():
        if line.startswith("VERDICT "):
            return json.loads(line[len("VERDICT ") :])
    raise AssertionError(f"the surviving rank printed no verdict:\n{stdout}")


@pytest.mark.timeout(60)
def test_dead_rank_in_ddp_backward_is_named_with_the_op():
    start = time.monotonic()
    ranks = _run_pair("kill", timeout_s=30)
    took = time.monotonic() - start
    rc, stdout, stderr = ranks[0]
    assert rc == 0, f"rank 0 exited {rc}:\n{stderr[-3000:]}"
    verdict = _verdict(stdout)
    assert verdict["type"] == "CommError", verdict
    assert verdict["ranks"] == [FAIL_RANK], verdict
    text = verdict["message"]
    assert "DistributedDataParallel's gradient all_reduce in backward" in text, text
    assert "group 'world'" in text and "rank 0 of 2" in text, text
    assert "rank 1" in text and "torch.distributed said" in text, text
    assert took < 40, f"naming the dead rank took {took:.0f} s (the timeout is 30 s)"


@pytest.mark.timeout(60)
def test_hung_rank_in_ddp_backward_is_named_after_the_timeout():
    ranks = _run_pair("hang", timeout_s=4)
    rc, stdout, stderr = ranks[0]
    assert rc == 0, f"rank 0 exited {rc}:\n{stderr[-3000:]}"
    verdict = _verdict(stdout)
    assert verdict["type"] == "CommError", verdict
    assert verdict["ranks"] == [FAIL_RANK], verdict
    assert "rank 1 has issued 2 collective(s) on group 'world', this rank 3" in verdict["message"]


def _meta_model(rank: int) -> str:
    from megalith.booster import Booster, TorchDDPPlugin

    with torch.device("meta"):
        model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2))
    try:
        Booster(plugin=TorchDDPPlugin()).boost(model)
    except ValueError as exc:
        return str(exc)
    return "no error"


@pytest.mark.timeout(60)
def test_meta_model_says_what_to_do():
    for text in run_distributed(_meta_model, 2, timeout=50):
        assert "TorchDDPPlugin: the model has parameters on the meta device" in text, text
        assert "0.weight" in text, "the message names a parameter"
        assert "to_empty" in text and "LazyInitContext" in text, text


def _train(mode: str) -> None:
    import megalith_comm as comm
    from megalith.booster import Booster, TorchDDPPlugin

    world = comm.init()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    booster = Booster(plugin=TorchDDPPlugin())
    model, opt, *_ = booster.boost(model, opt)
    g = torch.Generator().manual_seed(world.rank)
    try:
        for step in range(100):
            x = torch.randn(8, 16, generator=g)
            loss = model(x).pow(2).mean()
            if step == 2 and world.rank == FAIL_RANK:
                if mode == "kill":
                    os.kill(os.getpid(), signal.SIGKILL)
                time.sleep(600)  # hang: alive, its heartbeat beating
            booster.backward(loss, opt)
            opt.step()
            opt.zero_grad()
    except Exception as exc:
        verdict = {
            "type": type(exc).__name__,
            "ranks": list(getattr(exc, "ranks", ())),
            "message": str(exc),
        }
        print("VERDICT " + json.dumps(verdict), flush=True)
        os._exit(0)  # the peer is gone or stuck: nothing to leave cleanly
    raise AssertionError("DDP kept training without the failed rank")


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    _train(sys.argv[1])
