"""megalith._engine.memory: resources, buffers and their DLPack views, the
capacity search and chunks (C++ side: core/tests/test_memory_resources.cpp,
test_chunk_store.cpp)."""

from __future__ import annotations

import gc

import pytest
import torch

from megalith import _engine
from tests.support.gpu import gpu, has_cuda_engine

mem = _engine.memory
Tier = mem.Tier
MiB = 1 << 20
DTYPES = {
    "f32": torch.float32,
    "f16": torch.float16,
    "bf16": torch.bfloat16,
    "f64": torch.float64,
    "i8": torch.int8,
    "u8": torch.uint8,
    "i32": torch.int32,
    "i64": torch.int64,
}


def random_like(n: int, dtype: torch.dtype, gen: torch.Generator) -> torch.Tensor:
    if dtype.is_floating_point:
        return torch.randn(n, generator=gen).to(dtype)
    info = torch.iinfo(dtype)
    return torch.randint(info.min, info.max, (n,), generator=gen, dtype=torch.int64).to(dtype)


def test_tier_names():
    assert [str(t) for t in (Tier.device, Tier.pinned_host, Tier.host)] == [
        "device",
        "pinned_host",
        "host",
    ]


def test_resources_describe_themselves():
    host = mem.HostResource()
    pool = mem.PoolResource(host, block_bytes=MiB)
    stats = mem.StatisticsAdaptor(pool)
    lim = mem.LimitingAdaptor(stats, limit_bytes=4 * MiB)
    assert (host.tier, host.device, host.name) == (Tier.host, -1, "host")
    assert lim.name == "limit(stats(pool(host)))"
    assert lim.tier == Tier.host and lim.limit_bytes == 4 * MiB
    assert pool.block_bytes == MiB and pool.max_bytes == 0


@pytest.mark.parametrize("name", sorted(DTYPES))
def test_buffer_view_aliases_memory(name, gen):
    buf = mem.HostResource().allocate(4096, alignment=1024)
    assert buf.nbytes == 4096 and buf.tier == Tier.host and buf.device == -1
    assert buf.data_ptr % 1024 == 0
    dtype = DTYPES[name]
    n = 4096 // dtype.itemsize
    t = torch.from_dlpack(buf.view(name, n))
    assert t.dtype == dtype and t.shape == (n,) and t.device.type == "cpu"
    assert t.data_ptr() == buf.data_ptr
    x = random_like(n, dtype, gen)
    t.copy_(x)
    again = torch.from_dlpack(buf.view("u8", 4096))
    assert torch.equal(again.view(dtype), x)
    tail = torch.from_dlpack(buf.view(name, n // 2, offset_bytes=2048))
    assert torch.equal(tail, x[n // 2 :])


def test_view_keeps_buffer_alive(gen):
    stats = mem.StatisticsAdaptor(mem.HostResource())
    buf = stats.allocate(1024)
    t = torch.from_dlpack(buf.view("f32", 256))
    x = torch.randn(256, generator=gen)
    t.copy_(x)
    del buf
    gc.collect()
    assert stats.current_bytes == 1024
    assert torch.equal(t, x)
    del t
    gc.collect()
    assert stats.current_bytes == 0 and stats.peak_bytes == 1024 and stats.allocations == 1


def test_view_checks_bounds_and_alignment():
    buf = mem.HostResource().allocate(64)
    with pytest.raises(
        ValueError, match="offset_bytes 2 is not a multiple of the float32 element size 4"
    ):
        buf.view("f32", 4, offset_bytes=2)
    with pytest.raises(ValueError, match="goes past the end"):
        buf.view("f32", 17)
    with pytest.raises(ValueError, match="goes past the end"):
        buf.view("f64", 1, offset_bytes=64)
    with pytest.raises(ValueError, match="complex64"):
        buf.view("complex64", 1)
    assert torch.from_dlpack(buf.view("f32", 0, offset_bytes=64)).shape == (0,)


def test_out_of_memory_names_bytes_and_resource():
    lim = mem.LimitingAdaptor(mem.HostResource(), limit_bytes=MiB)
    keep = lim.allocate(MiB // 4)
    with pytest.raises(MemoryError) as e:
        lim.allocate(2 * MiB)
    msg = str(e.value)
    assert "cannot allocate 2.0 MiB (2097152 bytes) from 'limit(host)'" in msg
    assert "768.0 KiB (786432 bytes) free" in msg and "limit 1.0 MiB (1048576 bytes)" in msg
    pool = mem.PoolResource(mem.HostResource(), block_bytes=MiB, max_bytes=2 * MiB)
    with pytest.raises(MemoryError, match=r"pool\(host\).*max_bytes 2.0 MiB"):
        pool.allocate(3 * MiB)
    del keep


def test_pool_reuses_freed_memory(gen):
    upstream = mem.StatisticsAdaptor(mem.HostResource())
    pool = mem.PoolResource(upstream, block_bytes=MiB)
    a = pool.allocate(1000)
    ptr = a.data_ptr
    del a
    b = pool.allocate(900)
    assert b.data_ptr == ptr and upstream.allocations == 1
    assert pool.held_bytes == MiB and pool.used_bytes == 1024
    del b
    assert pool.release_unused() == MiB and upstream.current_bytes == 0


def test_search_chunk_capacity():
    assert mem.search_chunk_capacity([60, 50, 40], 1, 100, alignment=1) == (90, 30)
    assert mem.search_chunk_capacity([100, 100, 100], 1, 1000, 1) == (300, 0)
    assert mem.search_chunk_capacity([10, 10, 10], 40, 100, 16) == (42, 12)
    assert mem.count_chunks([60, 50, 40], 90, 1) == 2
    with pytest.raises(ValueError, match="tensor 1 has 500 bytes but max_capacity is 100 bytes"):
        mem.search_chunk_capacity([10, 500, 20], 1, 100)


def test_search_chunk_capacity_many_tensors(gen):
    sizes = (torch.randint(1, 4 * MiB, (10_000,), generator=gen) * 2).tolist()
    cap, waste = mem.search_chunk_capacity(sizes, 32 * MiB, 512 * MiB)
    chunks = mem.count_chunks(sizes, cap)
    assert 32 * MiB <= cap <= 512 * MiB
    assert waste == chunks * cap - sum(sizes)
    for other in (32 * MiB, 100 * MiB, 512 * MiB):
        assert mem.count_chunks(sizes, other) * other - sum(sizes) >= waste


def test_chunk_placement_and_views(gen):
    store = mem.ChunkStore(4096, host=mem.HostResource(), alignment=256)
    assert store.capacity == 4096 and store.alignment == 256
    c = store.new_chunk(Tier.host)
    assert (c.id, c.capacity, c.used_bytes, c.tier, c.resident) == (0, 4096, 0, Tier.host, True)
    assert c.place(100 * 4) == 0
    assert c.place(10 * 2) == 512
    assert c.place(8, alignment=8) == 536
    assert c.fits(3000) and not c.fits(3600)
    with pytest.raises(ValueError, match=r"chunk 0: cannot place.*capacity 4.0 KiB \(4096 bytes\)"):
        c.place(4000)
    w = torch.from_dlpack(c.view("f32", 100, 0))
    h = torch.from_dlpack(c.view("bf16", 10, 512))
    x, y = torch.randn(100, generator=gen), torch.randn(10, generator=gen).bfloat16()
    w.copy_(x)
    h.copy_(y)
    assert torch.equal(torch.from_dlpack(c.view("f32", 100, 0)), x)
    assert torch.equal(torch.from_dlpack(c.view("bf16", 10, 512)), y)
    with pytest.raises(ValueError, match="goes past the end"):
        c.view("f32", 1025, 0)


def test_chunk_release_allocate_and_stats(gen):
    store = mem.ChunkStore(MiB, host=mem.HostResource())
    a, b = store.new_chunk(Tier.host), store.new_chunk(Tier.host)
    assert store.stats(Tier.host) == {
        "current_bytes": 2 * MiB,
        "peak_bytes": 2 * MiB,
        "allocations": 2,
    }
    view = torch.from_dlpack(a.view("f32", 16, 0))
    a.release()
    assert not a.resident and a.data_ptr == 0
    assert store.stats(Tier.host)["current_bytes"] == 2 * MiB  # the view still holds the storage
    del view
    gc.collect()
    assert store.stats(Tier.host)["current_bytes"] == MiB
    with pytest.raises(ValueError, match="not resident"):
        a.view("f32", 1, 0)
    with pytest.raises(ValueError, match="not resident"):
        a.move_to(Tier.host)
    store.reset_peak()
    assert store.stats(Tier.host)["peak_bytes"] == MiB
    a.allocate(Tier.host)
    assert a.resident and store.stats(Tier.host)["current_bytes"] == 2 * MiB
    with pytest.raises(ValueError, match="already resident"):
        a.allocate(Tier.host)
    del b
    assert store.stats(Tier.host)["current_bytes"] == MiB
    assert store.stats(Tier.device) == {"current_bytes": 0, "peak_bytes": 0, "allocations": 0}


def test_missing_tier_names_keyword():
    store = mem.ChunkStore(1024, host=mem.HostResource())
    with pytest.raises(ValueError, match="no resource for tier device: pass device="):
        store.new_chunk(Tier.device)
    with pytest.raises(ValueError, match="no resource for tier pinned_host: pass pinned_host="):
        store.new_chunk(Tier.pinned_host)
    with pytest.raises(
        ValueError, match="the resource given as device \\('host'\\) serves tier host"
    ):
        mem.ChunkStore(1024, device=mem.HostResource())


def test_chunk_out_of_memory_names_chunk():
    store = mem.ChunkStore(MiB, host=mem.LimitingAdaptor(mem.HostResource(), 2 * MiB))
    keep = [store.new_chunk(Tier.host), store.new_chunk(Tier.host)]
    with pytest.raises(
        MemoryError, match=r"chunk 2 \(capacity 1.0 MiB \(1048576 bytes\)\) on tier host"
    ):
        store.new_chunk(Tier.host)
    assert len(keep) == 2


@pytest.mark.skipif(has_cuda_engine(), reason="checks the error of a machine without CUDA")
def test_gpu_resources_say_what_is_missing():
    with pytest.raises(RuntimeError, match="CUDA"):
        mem.PinnedHostResource()
    with pytest.raises((RuntimeError, ValueError), match="CUDA"):
        mem.DeviceResource(0)


@gpu
def test_device_buffer_view_is_cuda(gen):
    buf = mem.PoolResource(mem.DeviceResource(0), block_bytes=8 * MiB).allocate(MiB)
    assert buf.tier == Tier.device and buf.device == 0
    t = torch.from_dlpack(buf.view("f32", MiB // 4))
    assert t.device == torch.device("cuda", 0) and t.data_ptr() == buf.data_ptr
    x = torch.randn(MiB // 4, generator=gen)
    t.copy_(x.cuda())
    assert torch.equal(t.cpu(), x)


@gpu
def test_device_out_of_memory_names_free_bytes():
    _free, total = torch.cuda.mem_get_info(0)
    with pytest.raises(
        MemoryError, match=r"cannot allocate .* from 'device\(0\)' \(device cuda:0\): .* free"
    ):
        mem.DeviceResource(0).allocate(total + MiB)


@gpu
def test_chunk_round_trip_through_the_tiers(gen):
    store = mem.ChunkStore(
        3 * MiB + 512,
        host=mem.HostResource(),
        pinned_host=mem.PoolResource(mem.PinnedHostResource(), block_bytes=16 * MiB),
        device=mem.DeviceResource(0),
    )
    c = store.new_chunk(Tier.host)
    n = c.capacity // 4
    x = torch.randn(n, generator=gen)
    torch.from_dlpack(c.view("f32", n, 0)).copy_(x)
    stream = torch.cuda.Stream()
    for tier in (Tier.pinned_host, Tier.device, Tier.pinned_host, Tier.device, Tier.host):
        c.move_to(tier, stream=stream.cuda_stream)
        assert c.tier == tier
    c.synchronize()
    assert torch.equal(torch.from_dlpack(c.view("f32", n, 0)), x)
    c.move_to(Tier.device, stream=stream.cuda_stream)
    c.synchronize()
    on_gpu = torch.from_dlpack(c.view("f32", n, 0))
    assert on_gpu.is_cuda and torch.equal(on_gpu.cpu(), x)
    assert store.stats(Tier.device)["current_bytes"] == store.capacity
    assert store.stats(Tier.pinned_host)["current_bytes"] == 0
    assert store.stats(Tier.host)["current_bytes"] == 0
    del on_gpu
    c.release()
    assert store.stats(Tier.device)["current_bytes"] == 0
