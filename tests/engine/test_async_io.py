"""megalith._engine.io: async file I/O and per-run swap directories (C++ side:
core/tests/test_async_io.cpp). Round trips use fresh random tensors, never zeros."""

from __future__ import annotations

import errno
import os
import resource
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from megalith import _engine

io = _engine.io
MiB = 1 << 20
DTYPES = [torch.float32, torch.bfloat16, torch.uint8]


def random_tensor(n: int, dtype: torch.dtype, gen: torch.Generator) -> torch.Tensor:
    if dtype.is_floating_point:
        return torch.randn(n, generator=gen).to(dtype)
    return torch.randint(0, 256, (n,), generator=gen, dtype=torch.uint8)


def same_bytes(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.equal(a.view(torch.uint8), b.view(torch.uint8))


@pytest.mark.parametrize("direct", [True, False])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_round_trip_odd_sizes_and_offsets(tmp_path, gen, dtype, direct):
    engine = io.AsyncIO(threads=3, block_bytes=MiB, direct=direct)
    path = tmp_path / "data.bin"
    for count in (1, 511, 4097, 2 * MiB // 4 + 13):
        for offset in (0, 13, 4096, 3 * 4096 + 1):
            src = random_tensor(count, dtype, gen)
            req = engine.write(path, offset, src)
            req.wait()
            assert req.done() and req.nbytes == src.nbytes
            raw = path.read_bytes()[offset : offset + src.nbytes]
            assert raw == src.view(torch.uint8).numpy().tobytes()
            dst = random_tensor(count, dtype, gen)
            engine.read(str(path), offset, dst).wait()
            assert same_bytes(dst, src)
    assert engine.direct_io_active(tmp_path) == (direct and engine.direct_io_active(path))


def test_reports_the_mode_in_use(tmp_path, gen):
    path = tmp_path / "mode.bin"
    req = io.AsyncIO(direct=True).write(path, 0, random_tensor(10, torch.float32, gen))
    req.wait()
    assert req.direct == io.AsyncIO(direct=True).direct_io_active(path)
    assert "direct" in repr(req) and "done" in repr(req)
    buffered = io.AsyncIO(direct=False)
    assert not buffered.direct_io_active(path) and not buffered.direct
    assert (buffered.threads, buffered.block_bytes) == (4, 8 * MiB)


def test_descriptors_partial_reads_and_many_requests(tmp_path, gen):
    engine = io.AsyncIO(threads=4, block_bytes=64 * 1024)
    tensors = [random_tensor(int(n), torch.float32, gen) for n in torch.randint(1, 40000, (64,))]
    offsets, at = [], 0
    for t in tensors:
        offsets.append(at)
        at += t.nbytes + 7
    fd = os.open(tmp_path / "many.bin", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        reqs = [engine.write(fd, o, t) for o, t in zip(offsets, tensors)]
        for r in reqs:
            r.wait()
        back = [torch.empty_like(t) for t in tensors]
        reqs = [engine.read(fd, o, b) for o, b in zip(offsets, back)]
        for r, b, t in zip(reqs, back, tensors):
            r.wait()
            assert same_bytes(b, t)
        head = torch.zeros(8, dtype=torch.uint8)
        engine.read(fd, offsets[1], head, nbytes=3).wait()
        assert torch.equal(head[:3], tensors[1].view(torch.uint8)[:3]) and not head[3:].any()
    finally:
        os.close(fd)


def test_request_keeps_its_tensor_alive(tmp_path, gen):
    engine = io.AsyncIO(threads=1)
    src = random_tensor(4 * MiB, torch.float32, gen)
    expected = src.clone()
    req = engine.write(tmp_path / "alive.bin", 0, src)
    del src
    req.wait()
    back = torch.empty_like(expected)
    engine.read(tmp_path / "alive.bin", 0, back)  # dropped at once: waits before the tensor goes
    engine.read(tmp_path / "alive.bin", 0, back).wait()
    assert same_bytes(back, expected)


def test_errors(tmp_path):
    engine = io.AsyncIO()
    buf = torch.empty(100)
    with pytest.raises(FileNotFoundError, match=r"missing\.bin"):
        engine.read(tmp_path / "missing.bin", 0, buf)
    engine.write(tmp_path / "short.bin", 0, torch.ones(10)).wait()
    req = engine.read(tmp_path / "short.bin", 0, buf)
    with pytest.raises(OSError, match="the file ends at 40 bytes"):
        req.wait()
    with pytest.raises(ValueError, match="contiguous"):
        engine.write(tmp_path / "x.bin", 0, torch.ones(4, 4).t())
    with pytest.raises(ValueError, match="nbytes 401 is more than the array holds"):
        engine.write(tmp_path / "x.bin", 0, buf, nbytes=401)
    with pytest.raises(ValueError, match="threads must be at least 1"):
        io.AsyncIO(threads=0)


def check_disk_full(err: OSError, path_part: str, asked: int) -> None:
    text = str(err)
    assert err.errno in (errno.ENOSPC, errno.EFBIG, errno.EDQUOT)
    assert "disk full" in text and path_part in text
    assert f"({asked} bytes)" in text and "free on its filesystem" in text


def test_disk_full_is_clear_and_keeps_saved_data(tmp_path, gen):
    with io.SwapDir(tmp_path, "full") as swap:
        saved = random_tensor(MiB + 3, torch.uint8, gen)
        first = swap.allocate("first", 2 * MiB)
        first.write(saved, offset=5).wait()
        with pytest.raises(OSError) as huge:
            swap.allocate("huge", 1 << 62)  # more than any disk: fails at allocation
        check_disk_full(huge.value, "huge.swap", 1 << 62)
        plain = Path(swap.path) / "plain.bin"
        old_limit = resource.getrlimit(resource.RLIMIT_FSIZE)
        old_handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        try:  # the process may write files of at most 4 MiB: EFBIG past that
            resource.setrlimit(resource.RLIMIT_FSIZE, (4 * MiB, old_limit[1]))
            with pytest.raises(OSError) as over:
                swap.allocate("second", 6 * MiB)
            check_disk_full(over.value, "second.swap", 6 * MiB)
            assert not any("second" in p.name for p in Path(swap.path).iterdir())
            swap.io.write(plain, 0, saved).wait()
            req = swap.io.write(plain, saved.nbytes, random_tensor(5 * MiB, torch.uint8, gen))
            with pytest.raises(OSError) as mid:
                req.wait()
            check_disk_full(mid.value, "plain.bin", 5 * MiB)
            assert "RLIMIT_FSIZE" in str(mid.value)
        finally:
            resource.setrlimit(resource.RLIMIT_FSIZE, old_limit)
            signal.signal(signal.SIGXFSZ, old_handler)
        back = torch.empty_like(saved)
        first.read(back, offset=5).wait()
        assert same_bytes(back, saved)
        assert plain.read_bytes()[: saved.nbytes] == saved.numpy().tobytes()


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="no /dev/full")
def test_enospc_from_dev_full(gen):
    req = io.AsyncIO().write("/dev/full", 0, random_tensor(5000, torch.uint8, gen))
    with pytest.raises(OSError) as full:
        req.wait()
    assert full.value.errno == errno.ENOSPC and "No space left on device" in str(full.value)
    check_disk_full(full.value, "'/dev/full'", 5000)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_swap_file_round_trip(tmp_path, gen, dtype):
    with io.SwapDir(tmp_path, "run") as swap:
        a, b = random_tensor(3001, dtype, gen), random_tensor(77, dtype, gen)
        f = swap.allocate("state", a.nbytes + b.nbytes)
        assert f.nbytes == a.nbytes + b.nbytes and os.path.getsize(f.path) == f.nbytes
        assert swap.id in os.path.basename(f.path) and f.path.startswith(swap.path)
        reqs = [f.write(a), f.write(b, offset=a.nbytes)]
        for r in reqs:
            r.wait()
        a2, b2 = torch.empty_like(a), torch.empty_like(b)
        f.read(b2, offset=a.nbytes).wait()
        f.read(a2).wait()
        assert same_bytes(a2, a) and same_bytes(b2, b)
        with pytest.raises(ValueError, match="go past the end"):
            f.write(a, offset=b.nbytes + 1)
        with pytest.raises(ValueError, match="name"):
            swap.allocate("../escape", 10)


def test_swap_dir_cleanup(tmp_path):
    swap = io.SwapDir(tmp_path, "gc")
    path = Path(swap.path)
    assert path.name.startswith("megalith-swap-gc-") and (path / "megalith-swap.lock").is_file()
    f = swap.allocate("kept", 4096)
    del swap
    assert path.is_dir()  # its file keeps it
    del f
    assert not path.exists()
    with io.SwapDir(tmp_path) as swap:
        path = Path(swap.path)
    assert not path.exists() and swap.removed
    with pytest.raises(RuntimeError, match="was removed"):
        swap.allocate("late", 1)


def run_python(code: str) -> str:
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    return out.stdout.strip()


def test_exit_removes_and_a_crash_leaves_a_stale_dir(tmp_path):
    make = f"from megalith._engine import io; d = io.SwapDir({str(tmp_path)!r}, '{{}}'); "
    make += "d.allocate('x', 4096); print(d.path); "
    kept = run_python(make.format("exit") + "import builtins; builtins.keep = d")
    assert kept and not os.path.exists(kept)  # removed at exit, though never collected
    crashed = run_python(make.format("crash") + "import os, sys; sys.stdout.flush(); os._exit(0)")
    assert os.path.isdir(crashed)
    with io.SwapDir(tmp_path, "live", clean_stale=False) as live:
        assert io.SwapDir.find_stale(tmp_path) == [crashed]  # `live` holds its lock
        assert io.SwapDir.clean_stale(tmp_path) == [crashed]
        assert not os.path.exists(crashed) and os.path.isdir(live.path)
