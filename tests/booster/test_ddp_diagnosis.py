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


@pytest.mark.timeout(60)
def test_dead_rank_in_bare_backward_is_named_with_the_op():
    """loss.backward() itself, not booster.backward: the comm hook raises the CommError."""
    start = time.monotonic()
    rc, stdout, stderr = _run_pair("kill-bare", timeout_s=30)[0]
    took = time.monotonic() - start
    assert rc == 0, f"rank 0 exited {rc}:\n{stderr[-3000:]}"
    verdict = _verdict(stdout)
    assert verdict["type"] == "CommError" and verdict["ranks"] == [FAIL_RANK], verdict
    text = verdict["message"]
    assert "DistributedDataParallel's gradient all_reduce in backward (bucket 0" in text, text
    assert "on group 'world' failed on rank 0 of 2" in text, text
    assert "rank 1 stopped without reporting an error" in text, text
    assert took < 40, f"naming the dead rank took {took:.0f} s (the timeout is 30 s)"


@pytest.mark.timeout(60)
def test_hung_rank_in_bare_backward_is_named_after_the_timeout():
    rc, stdout, stderr = _run_pair("hang-bare", timeout_s=4)[0]
    assert rc == 0, f"rank 0 exited {rc}:\n{stderr[-3000:]}"
    verdict = _verdict(stdout)
    assert verdict["type"] == "CommError" and verdict["ranks"] == [FAIL_RANK], verdict
    text = verdict["message"]
    assert "after 4 s (the collective timeout)" in text, text
    assert "rank 1 has issued 2 collective(s) on group 'world', this rank 3" in text, text


def _hooked_values(rank: int, world_size: int) -> dict:
    """Four steps of the boosted model (comm hook, bare backward, a no_sync accumulation,
    then a user's hook) against torch's DDP with its built-in all_reduce on the same data,
    and against one process on all ranks' data."""
    import copy

    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    import megalith_comm as comm
    from megalith.booster import Booster, TorchDDPPlugin

    torch.manual_seed(0)
    # DDP's first bucket holds up to 1 MiB whatever bucket_cap_mb says: the last layer
    # (the first to be reduced) is larger, so that there are two buckets.
    net = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.Tanh(), torch.nn.Linear(64, 4200))
    single = copy.deepcopy(net)
    start = {k: p.detach().clone() for k, p in net.named_parameters()}
    ref = torch.nn.parallel.DistributedDataParallel(copy.deepcopy(net), bucket_cap_mb=0.002)
    plugin = TorchDDPPlugin(bucket_cap_mb=0.002)  # several buckets of the small model
    model, opt, *_ = Booster(plugin=plugin).boost(net, torch.optim.SGD(net.parameters(), lr=1.0))
    ref_opt = torch.optim.SGD(ref.parameters(), lr=1.0)
    single_opt = torch.optim.SGD(single.parameters(), lr=1.0)
    gens = [torch.Generator().manual_seed(100 + r) for r in range(world_size)]
    calls: list[int] = []

    def user_hook(state, bucket):
        calls.append(bucket.index())
        return allreduce_hook(None, bucket)

    issued = comm.get_world().group.issued
    for step in range(4):
        xs = [torch.randn(5, 16, generator=g) for g in gens]
        x = xs[rank]
        sum(single(b).pow(2).mean() for b in xs).div(world_size).backward()
        if step == 3:  # torch's allreduce_hook divides (not times 1/n): bit-equal ends here
            bit_equal = all(
                torch.equal(a, b) for a, b in zip(net.parameters(), ref.module.parameters())
            )
            model.module.register_comm_hook(None, user_hook)
        if step == 1:  # accumulate without synchronising; the next step all-reduces both
            with model.module.no_sync(), ref.no_sync():
                model(x).pow(2).mean().backward()
                ref(x).pow(2).mean().backward()
            continue
        model(x).pow(2).mean().backward()
        ref(x).pow(2).mean().backward()
        for o in (opt, ref_opt, single_opt):
            o.step()
            o.zero_grad()
    with torch.no_grad():
        mine = dict(model.unwrap().named_parameters())
        theirs = dict(ref.module.named_parameters())
        alone = dict(single.named_parameters())
        return {
            "bit_equal": bit_equal,
            "ref_diff": max(float((mine[k] - theirs[k]).abs().max()) for k in mine),
            "single_diff": max(float((mine[k] - alone[k]).abs().max()) for k in mine),
            "moved": max(float((alone[k] - start[k]).abs().max()) for k in alone),
            "issued": comm.get_world().group.issued - issued,
            "user_calls": sorted(set(calls)),
        }


@pytest.mark.timeout(120)
@pytest.mark.parametrize("world_size", [2, 3])
def test_comm_hook_gives_torch_ddp_values_bit_for_bit(world_size):
    for r in run_distributed(_hooked_values, world_size, world_size, timeout=100):
        assert r["bit_equal"] and r["ref_diff"] < 1e-6, r
        assert r["single_diff"] < 1e-6 and r["moved"] > 1e-3, r
        assert len(r["user_calls"]) > 1 and r["user_calls"][0] == 0, r
        assert r["issued"] == 3, r  # one per synchronising backward (steps 0, 2, 3)


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
                if mode.startswith("kill"):
                    os.kill(os.getpid(), signal.SIGKILL)
                time.sleep(600)  # hang: alive, its heartbeat beating
            if mode.endswith("bare"):
                loss.backward()  # torch's own backward: the comm hook diagnoses
            else:
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
