"""AsyncIO's backends through megalith._engine.io: the thread pool and io_uring move
the same bytes, and the choice of backend (C++ side: core/tests/test_async_io_uring.cpp).
Round trips use fresh random bytes, never zeros."""

from __future__ import annotations

import re

import pytest
import torch

from megalith import _engine
from megalith.cli import env as env_cmd

io = _engine.io
MiB = 1 << 20
URING_WHY = io.uring_unavailable_reason()
BACKENDS = ["threads"] + ([] if URING_WHY else ["uring"])
needs_uring = pytest.mark.skipif(bool(URING_WHY), reason=f"no io_uring here: {URING_WHY}")


@pytest.fixture(autouse=True)
def no_backend_override(monkeypatch):
    monkeypatch.delenv("MEGALITH_IO_BACKEND", raising=False)


def random_bytes(n: int, gen: torch.Generator) -> torch.Tensor:
    return torch.randint(0, 256, (n,), generator=gen, dtype=torch.uint8)


def aligned_bytes(n: int, skew: int) -> torch.Tensor:
    """n bytes of engine memory starting `skew` bytes past a 4096-byte boundary."""
    buf = _engine.memory.HostResource().allocate(n + skew, 4096)
    return torch.from_dlpack(buf.view("u8", n + skew))[skew:]


@needs_uring
@pytest.mark.parametrize("direct", [True, False])
def test_backends_give_identical_bytes(tmp_path, gen, direct):
    engines = {
        name: io.AsyncIO(threads=3, block_bytes=MiB, direct=direct, backend=name)
        for name in ("threads", "uring")
    }
    assert {name: e.backend for name, e in engines.items()} == {
        "threads": "threads",
        "uring": "uring",
    }
    paths = {name: tmp_path / f"{name}.bin" for name in engines}
    for nbytes in (1, 4095, 4096, 4097, 3 * MiB + 5, 2 * MiB):
        for offset in (0, 13, 4096, 5 * MiB - 7):
            for skew in (0, 1, 64):
                src = aligned_bytes(nbytes, skew)
                src.copy_(random_bytes(nbytes, gen))
                for name, engine in engines.items():
                    engine.write(paths[name], offset, src).wait()
                # Each backend reads what the other wrote.
                for name, other in (("threads", "uring"), ("uring", "threads")):
                    dst = aligned_bytes(nbytes, (skew + 7) % 4096)
                    dst.copy_(random_bytes(nbytes, gen))
                    engines[name].read(paths[other], offset, dst).wait()
                    assert torch.equal(dst, src), (name, nbytes, offset, skew)
    assert paths["threads"].read_bytes() == paths["uring"].read_bytes()


@pytest.mark.parametrize("backend", BACKENDS)
def test_many_requests_in_flight(tmp_path, gen, backend):
    engine = io.AsyncIO(threads=2, block_bytes=64 * 1024, backend=backend, queue_depth=8)
    assert engine.queue_depth == 8
    tensors = [random_bytes(int(n), gen) for n in torch.randint(1, 300_000, (40,), generator=gen)]
    offsets, at = [], 0
    for t in tensors:
        offsets.append(at)
        at += t.numel() + 4099
    path = tmp_path / "many.bin"
    for r in [engine.write(path, o, t) for o, t in zip(offsets, tensors)]:
        r.wait()
    back = [torch.empty_like(t) for t in tensors]
    for r in [engine.read(path, o, b) for o, b in zip(offsets, back)]:
        r.wait()
    assert all(torch.equal(b, t) for b, t in zip(back, tensors))


@pytest.mark.parametrize("backend", BACKENDS)
def test_read_past_the_end_raises(tmp_path, gen, backend):
    engine = io.AsyncIO(block_bytes=4096, backend=backend)
    path = tmp_path / "short.bin"
    engine.write(path, 0, random_bytes(10_000, gen)).wait()
    req = engine.read(path, 0, aligned_bytes(16384, 0))
    with pytest.raises(OSError, match="the file ends at 10000 bytes"):
        req.wait()


def test_backend_property_and_automatic_choice():
    assert io.AsyncIO(backend="threads").backend == "threads"
    assert io.AsyncIO().backend == ("threads" if URING_WHY else "uring")
    if URING_WHY:
        with pytest.raises(OSError, match='backend="threads"'):
            io.AsyncIO(backend="uring")
    else:
        assert io.AsyncIO(backend="uring").backend == "uring"


def test_bad_backend_string_names_the_allowed_values():
    with pytest.raises(ValueError, match='"threads", "uring" or "auto", got "io_uring"'):
        io.AsyncIO(backend="io_uring")
    with pytest.raises(ValueError, match=re.escape("queue_depth must be in 1..4096, got 0")):
        io.AsyncIO(queue_depth=0)


def test_environment_overrides_auto_only(monkeypatch):
    monkeypatch.setenv("MEGALITH_IO_BACKEND", "threads")
    assert io.AsyncIO().backend == "threads"
    if not URING_WHY:
        assert io.AsyncIO(backend="uring").backend == "uring"
    monkeypatch.setenv("MEGALITH_IO_BACKEND", "fast")
    with pytest.raises(ValueError, match="MEGALITH_IO_BACKEND must be threads, uring or auto"):
        io.AsyncIO()
    assert io.AsyncIO(backend="threads").backend == "threads"


def test_env_report_names_the_backend():
    line = env_cmd.build_section()["io_backend"]
    assert line.split()[0] == io.AsyncIO().backend
    if URING_WHY:
        assert "io_uring" in line
