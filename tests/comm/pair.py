"""Two-rank runs of the engine's NCCL communicator (one process per GPU), for
tests/test_comm_engine_gpu.py. Rank 0 makes the unique id and hands it over
through a file in the test's temporary directory.
"""

from __future__ import annotations

import os
import site
import sys
import time
from pathlib import Path

import torch
import torch.multiprocessing as mp

from megalith import _engine


def find_nccl() -> bool:
    """Points the engine at the nvidia-nccl-cu13 wheel's libnccl when one is
    installed (megalith_comm does the same); True when some libnccl loads."""
    bases = [*site.getsitepackages(), site.getusersitepackages(), *sys.path]
    for base in bases:
        for sub in ("nvidia/nccl/lib", "nvidia/cu13/lib"):
            d = Path(base) / sub
            if (d / "libnccl.so.2").exists():
                _engine.set_nccl_search_path(str(d))
                return True
    return _engine.nccl_available()


def run_pair(scenario: str, tmp_path: Path) -> None:
    """Runs SCENARIOS[scenario](rank, comm uid, tmp) on ranks 0 and 1; a failure in either raises."""
    mp.spawn(_worker, args=(scenario, str(tmp_path)), nprocs=2, join=True)


def _worker(rank: int, scenario: str, tmp: str) -> None:
    find_nccl()
    torch.cuda.set_device(rank)
    SCENARIOS[scenario](rank, _exchange_id(rank, Path(tmp)), Path(tmp))


def _exchange_id(rank: int, tmp: Path) -> bytes:
    path = tmp / "uid"
    if rank == 0:
        uid = _engine.nccl_unique_id()
        (tmp / "uid.tmp").write_bytes(uid)
        os.replace(tmp / "uid.tmp", path)
        return uid
    _wait_for(path, 60.0)
    return path.read_bytes()


def _wait_for(path: Path, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while not path.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} did not appear within {seconds} s")
        time.sleep(0.01)


def _rank_input(rank: int, n: int, dtype: torch.dtype) -> torch.Tensor:
    """The same tensor on every process for a given (rank, n, dtype): references need no exchange."""
    g = torch.Generator().manual_seed(1000 * rank + n)
    if dtype.is_floating_point:
        return torch.randn(n, generator=g).to(dtype).cuda()
    return torch.randint(-1000, 1000, (n,), generator=g, dtype=dtype).cuda()


def _check(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    if got.dtype == torch.float32:
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6, msg=what)
    elif got.dtype == torch.bfloat16:
        torch.testing.assert_close(got, want, msg=what)  # bf16's own tolerance
    else:
        torch.testing.assert_close(got, want, rtol=0, atol=0, msg=what)


def _every_op(rank: int, uid: bytes, tmp: Path) -> None:
    comm = _engine.NcclCommunicator(uid, 2, rank, rank, timeout_s=60.0, name="pair")
    s = torch.cuda.current_stream().cuda_stream
    for dtype in (torch.float32, torch.bfloat16, torch.int64):
        for n in (1, 7, 1000, 4097):
            xs = [_rank_input(r, n, dtype) for r in range(2)]
            x, tag = xs[rank], f"{dtype} n={n} rank={rank}"
            refs = {
                "sum": xs[0] + xs[1],
                "prod": xs[0] * xs[1],
                "max": torch.maximum(xs[0], xs[1]),
                "min": torch.minimum(xs[0], xs[1]),
            }
            if dtype.is_floating_point:
                refs["avg"] = ((xs[0].float() + xs[1].float()) / 2).to(dtype)
            for op, ref in refs.items():
                y = torch.zeros_like(x)
                comm.all_reduce(x, y, op=op, stream=s).synchronize()
                _check(y, ref, f"all_reduce {op} {tag}")

            big = [_rank_input(r, 2 * n, dtype) for r in range(2)]  # 2 blocks of n
            y = torch.zeros_like(x)
            comm.reduce_scatter(big[rank], y, stream=s).synchronize()
            _check(y, (big[0] + big[1])[rank * n : (rank + 1) * n], f"reduce_scatter {tag}")
            y = torch.zeros(2 * n, dtype=dtype, device="cuda")
            comm.all_gather(x, y, stream=s).synchronize()
            _check(y, torch.cat(xs), f"all_gather {tag}")
            b = x.clone()
            comm.broadcast(b, root=1, stream=s).synchronize()
            _check(b, xs[1], f"broadcast {tag}")
            y = torch.zeros_like(x)
            comm.reduce(x, y, root=0, stream=s).synchronize()
            _check(y, refs["sum"] if rank == 0 else torch.zeros_like(x), f"reduce {tag}")

            y = torch.zeros_like(x)  # a pair exchange: both send and receive in one group
            comm.group_start()
            comm.send(x, peer=1 - rank, stream=s)
            r = comm.recv(y, peer=1 - rank, stream=s)
            comm.group_end()
            r.synchronize()
            _check(y, xs[1 - rank], f"send/recv {tag}")
            if rank == 0:  # and a lone send matched by a lone recv
                comm.send(x, peer=1, stream=s).synchronize()
            else:
                y = torch.zeros_like(x)
                comm.recv(y, peer=0, stream=s).synchronize()
                _check(y, xs[0], f"recv {tag}")

            y = torch.zeros_like(big[rank])
            comm.all_to_all(big[rank], y, stream=s).synchronize()
            want = torch.cat([big[j][rank * n : (rank + 1) * n] for j in range(2)])
            _check(y, want, f"all_to_all {tag}")

            # Uneven: rank i sends counts[i][j] elements to rank j, blocks packed in rank order.
            counts = [[n % 5, n + 3], [2 * n + 1, 0]]
            sends = [_rank_input(10 + i, sum(counts[i]), dtype) for i in range(2)]
            recv_counts = [counts[j][rank] for j in range(2)]
            y = torch.zeros(sum(recv_counts), dtype=dtype, device="cuda")
            comm.all_to_allv(sends[rank], counts[rank], y, recv_counts, stream=s).synchronize()
            want = torch.cat(
                [sends[j][sum(counts[j][:rank]) : sum(counts[j][: rank + 1])] for j in range(2)]
            )
            _check(y, want, f"all_to_allv {tag}")
    comm.barrier(stream=s).synchronize()
    assert comm.error() is None
    del comm


def _skip(rank: int, uid: bytes, tmp: Path) -> None:
    """Rank 1 never calls the second all_reduce: rank 0 must raise within the timeout."""
    comm = _engine.NcclCommunicator(uid, 2, rank, rank, timeout_s=5.0, name="pair-wd")
    s = torch.cuda.current_stream().cuda_stream
    x = torch.ones(1 << 20, device="cuda")
    comm.all_reduce(x, x, stream=s).synchronize()  # both join once: connections are up
    done = tmp / "rank0-done"
    if rank == 1:
        _wait_for(done, 60.0)
        comm.abort()  # its peer aborted: no clean destroy to wait for
        return
    t0 = time.monotonic()
    work = comm.all_reduce(x, x, stream=s)
    try:
        work.synchronize()
        raise AssertionError("the all_reduce rank 1 skipped completed")
    except RuntimeError as e:
        text = str(e)
    waited = time.monotonic() - t0
    print(f"rank 0 raised after {waited:.1f} s: {text}", flush=True)
    assert waited < 8.0, f"took {waited:.1f} s for a 5 s timeout"
    assert "all_reduce on 'pair-wd' (rank 0 of 2, 1048576 x float32)" in text, text
    assert "did not finish within 5.0 s" in text, text
    try:
        comm.barrier(stream=s)
        raise AssertionError("a failed communicator accepted another call")
    except RuntimeError as e:
        assert "'pair-wd' (rank 0 of 2" in str(e), str(e)
    done.write_text("ok")
    del comm


SCENARIOS = {"every_op": _every_op, "skip": _skip}
