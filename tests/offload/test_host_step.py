"""megalith_offload's HostStepper on its own (CPU): the pipelined host update writes only the
pieces it is given, surfaces a failed update at wait() and stays usable, and a stepper
dropped without close() stops its worker thread and returns its staging memory."""

from __future__ import annotations

import gc
import threading
import time
from types import SimpleNamespace

import pytest
import torch

from megalith_core.memory import StateMemory
from megalith_offload import HostStepper


def chunk(n: int, seed: int) -> SimpleNamespace:
    g = torch.Generator().manual_seed(seed)
    return SimpleNamespace(
        spec=SimpleNamespace(shard_numel=n),
        shard_grad=torch.randn(n, generator=g),
        shard=torch.randn(n, generator=g),
    )


def double_grad(grads: torch.Tensor, params: torch.Tensor) -> None:
    params.copy_(grads * 2)


def test_updates_only_the_given_pieces_in_order():
    chunks = [chunk(n, i) for i, n in enumerate((5, 9, 7, 9, 3))]
    tier = StateMemory.host(pinned=False)
    stepper = HostStepper(chunks, tier, torch.device("cpu"), slots=2)
    before = [c.shard.clone() for c in chunks]
    seen = []

    def work_of(i):
        def work(grads, params):
            seen.append(i)
            double_grad(grads, params)

        return work

    for i, c in enumerate(chunks):
        pieces = [slice(0, c.spec.shard_numel)] if i != 1 else [slice(1, 3), slice(6, 8)]
        stepper.submit(c, work_of(i), pieces)
    stepper.wait()
    assert seen == [0, 1, 2, 3, 4]
    for i, (c, old) in enumerate(zip(chunks, before)):
        want = c.shard_grad * 2
        if i == 1:  # outside its pieces the shard keeps its values
            want = old.clone()
            want[1:3], want[6:8] = c.shard_grad[1:3] * 2, c.shard_grad[6:8] * 2
        assert torch.equal(c.shard, want), i
    stepper.close()


def test_a_failed_update_is_raised_at_wait_and_the_next_step_runs():
    c = chunk(8, 0)
    stepper = HostStepper([c], StateMemory.host(pinned=False), torch.device("cpu"))

    def fail(grads, params):
        raise ValueError("lr=-1 is not allowed")

    stepper.submit(c, fail, [slice(0, 8)])
    stepper.submit(c, double_grad, [slice(0, 8)])  # skipped: the step already failed
    with pytest.raises(RuntimeError, match="the host step failed: lr=-1 is not allowed"):
        stepper.wait()
    stepper.submit(c, double_grad, [slice(0, 8)])
    stepper.wait()
    assert torch.equal(c.shard, c.shard_grad * 2)
    stepper.close()


def _workers() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "megalith-host-step"]


def test_a_dropped_stepper_stops_its_worker_and_frees_staging():
    tier = StateMemory.host(pinned=False)
    c = chunk(1 << 16, 1)
    before = len(_workers())
    stepper = HostStepper([c], tier, torch.device("cpu"))
    stepper.submit(c, double_grad, [slice(0, 1 << 16)])
    stepper.wait()
    assert tier.current_bytes > 0 and len(_workers()) == before + 1
    del stepper
    gc.collect()
    deadline = time.monotonic() + 10
    while len(_workers()) > before and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(_workers()) == before
    assert tier.current_bytes == 0


EXIT_SCRIPT = """
import sys, time, torch
from types import SimpleNamespace
from megalith_core.memory import StateMemory
from megalith_offload import HostStepper

n = 1000
c = SimpleNamespace(spec=SimpleNamespace(shard_numel=n), shard_grad=torch.randn(n),
                    shard=torch.zeros(n))
stepper = HostStepper([c], StateMemory.host(pinned=False), torch.device("cpu"), slots=2)

def slow(grads, params):
    time.sleep(0.5)
    params.copy_(grads)
    open(sys.argv[1], "w").write("done")

stepper.submit(c, slow, [slice(0, n)])
# no wait(), no close(): the interpreter exits with the update still running
"""


def test_interpreter_exit_joins_a_running_worker(tmp_path):
    """A worker still running when the interpreter exits is joined first: before, the
    daemon thread was stopped inside whatever call it was in (on CUDA, inside C++, which
    aborted the process: "terminate called without an active exception")."""
    import subprocess
    import sys

    marker = tmp_path / "done"
    proc = subprocess.run(
        [sys.executable, "-c", EXIT_SCRIPT, str(marker)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert "terminate" not in proc.stderr, proc.stderr
    assert marker.read_text() == "done"  # the update ran to its end


def test_chunks_updated_in_place_get_no_parameter_staging():
    """Shards in host memory (param_frac) are written by the update itself: the stepper
    keeps gradient staging only."""
    chunks = [chunk(n, i) for i, n in enumerate((5, 9))]
    for c in chunks:
        c.params_on_host = True
    tier = StateMemory.host(pinned=False)
    stepper = HostStepper(chunks, tier, torch.device("cpu"), slots=2)
    assert tier.report().get("param_staging", (0, 0))[0] == 0
    assert tier.report()["grad_staging"][0] > 0

    def in_place(c):
        def work(grads, params):
            assert params is c.shard
            c.shard.copy_(grads * 3)

        return work

    for c in chunks:
        stepper.submit(c, in_place(c), [])
    stepper.wait()
    for c in chunks:
        assert torch.equal(c.shard, c.shard_grad * 3)
    stepper.close()
