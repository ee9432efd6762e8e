"""megalith_offload on its own: config validation, static placement, the host tier's
accounting and the NVMe store's overlapped round trips (no process group needed)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from megalith import _engine
from megalith_core.memory import StateMemory
from megalith_offload import ChunkCost, OffloadConfig, SwapStore, file_bytes, plan


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"tier": "gpu"}, "tier='gpu'; expected 'host', 'nvme' or 'host\\+nvme'"),
        ({"tier": "host+nvme"}, "tier='host\\+nvme' needs host_budget_bytes"),
        ({"cpu_threads": 0}, "cpu_threads=0; expected None or an int >= 1"),
        ({"io_backend": "aio"}, "io_backend='aio'; expected 'auto', 'uring' or 'threads'"),
        ({"param_frac": 1.5}, "param_frac=1.5; expected 0 <= param_frac <= 1"),
        (
            {"param_frac": 0.5, "placement": "auto"},
            "decides which parameter shards leave the device itself.*placement='static'",
        ),
        ({"optim_frac": 1.5}, "optim_frac=1.5; expected 0 <= optim_frac <= 1"),
        ({"optim_frac": -0.1}, "optim_frac=-0.1"),
        ({"device_budget_bytes": -1}, "device_budget_bytes=-1; expected None or an int >= 0"),
        ({"host_budget_bytes": 1.5}, "host_budget_bytes=1.5"),
        ({"io_threads": 0}, "io_threads=0; expected >= 1"),
        ({"run_name": "a/b"}, "run_name='a/b'"),
    ],
)
def test_config_names_the_bad_number(kwargs, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        OffloadConfig(**kwargs)


def costs(n: int, each: int = 1000) -> list[ChunkCost]:
    return [ChunkCost(device=3 * each, master=each, states=2 * each, swap=8192) for _ in range(n)]


def test_fractions_and_device_budget():
    assert plan(costs(4), OffloadConfig(optim_frac=0.0)).tiers == ("device",) * 4
    assert plan(costs(4), OffloadConfig(optim_frac=0.5)).tiers == (
        "host",
        "host",
        "device",
        "device",
    )
    assert plan(costs(3), OffloadConfig(optim_frac=0.5)).tiers == ("host", "host", "device")
    p = plan(costs(4), OffloadConfig(optim_frac=0.0, device_budget_bytes=6500))
    assert p.tiers == ("device", "device", "host", "host") and p.device_bytes == 6000
    assert p.host_bytes == 2 * 3000
    nv = plan(costs(4), OffloadConfig(tier="nvme"))
    assert nv.tiers == ("nvme",) * 4 and nv.slots == 2 and nv.nvme_bytes == 4 * 8192
    assert nv.host_bytes == 4 * 1000 + 2 * 8192


def test_host_budget_too_small_gives_the_numbers():
    with pytest.raises(
        ValueError, match=r"host_budget_bytes=2999 is too small for even one chunk: .* 3000 bytes"
    ):
        plan(costs(4), OffloadConfig(host_budget_bytes=2999))
    with pytest.raises(
        ValueError, match=r"host_budget_bytes=5000, but the 4 offloaded chunks need 12000 bytes"
    ):
        plan(costs(4), OffloadConfig(host_budget_bytes=5000))
    with pytest.raises(
        ValueError,
        match=r"staging\) take 4000 bytes and one NVMe staging buffer .* 8192 bytes, 12192",
    ):
        plan(costs(4), OffloadConfig(tier="nvme", host_budget_bytes=12000))
    one = plan(costs(4), OffloadConfig(tier="nvme", host_budget_bytes=13000))
    assert one.slots == 1 and one.host_bytes == 12192  # room for one buffer: no overlap


def test_host_then_nvme_fills_the_host_budget_first():
    # 4 offloaded chunks: masters 40000 bytes; states 20000 each; 2 staging buffers of
    # 8192 while any chunk is left on NVMe
    def placed(budget: int, frac: float = 1.0):
        config = OffloadConfig(tier="host+nvme", host_budget_bytes=budget, optim_frac=frac)
        return plan(costs(4, 10000), config)

    assert placed(40000 + 16384).tiers == ("nvme",) * 4
    p = placed(40000 + 40000 + 16384)
    assert p.tiers == ("host", "host", "nvme", "nvme")
    assert (p.slots, p.host_bytes, p.nvme_bytes) == (2, 96384, 2 * 8192)
    assert placed(116384).tiers == ("host", "host", "host", "nvme")
    everything = placed(120000)
    assert everything.tiers == ("host",) * 4 and everything.slots == 0
    assert placed(60000, frac=0.5).tiers == ("host", "host", "device", "device")
    with pytest.raises(ValueError, match=r"too small for tier='host\+nvme': .* 48192 in all"):
        placed(48192 - 1)


def test_parameters_go_to_the_host_only_with_their_states():
    p = plan([ChunkCost(3000, 1000, 2000, 8192, params=500)] * 4, OffloadConfig(param_frac=0.5))
    assert p.params_on_host == (True, True, False, False)
    assert p.host_bytes == 4 * 3000 + 2 * 500
    with pytest.raises(ValueError, match=r"first 2 of 4 chunks, but chunk 1 keeps its optimizer"):
        plan(costs(4), OffloadConfig(optim_frac=0.25, param_frac=0.5))


def test_host_tier_accounting_and_limit():
    host = StateMemory.host(limit_bytes=64 * 1024, pinned=False, kinds=("master",))
    a = host.zeros("master", 1000)
    b = host.empty("optim_states", 3000)
    assert a.data_ptr() % 4096 == 0 and b.data_ptr() % 4096 == 0 and not a.any()
    assert host.report() == {"master": (4000, 4000), "optim_states": (12000, 12000)}
    del b
    assert host.report()["optim_states"] == (0, 12000)
    with pytest.raises(MemoryError, match="host budget 65536 bytes, 4000 in use"):
        host.empty("optim_states", 20000)


@pytest.mark.parametrize("backend", ["threads", "uring"])
def test_swap_store_round_trip_overlapped(tmp_path, gen, backend):
    if backend == "uring" and _engine.io.uring_unavailable_reason():
        pytest.skip(_engine.io.uring_unavailable_reason())
    host = StateMemory.host(pinned=False)
    cfg = OffloadConfig(tier="nvme", swap_dir=str(tmp_path), run_name="unit", io_backend=backend)
    sizes = {0: 1000, 1: 1, 2: 4097, 3: 777}
    slot = max(file_bytes(n, 2) for n in sizes.values())
    store = SwapStore(cfg, rank=3, host=host, slots=2, slot_bytes=slot)
    assert store.io.backend == backend
    assert Path(store.path).parent == tmp_path and "unit-rank3" in Path(store.path).name
    for k, n in sizes.items():
        store.ensure(k, ("exp_avg", "exp_avg_sq"), n)
    expected = {}
    for step in range(3):  # each pass reads what the last one wrote
        for k, states in store.stream(list(sizes)):
            for name, t in states.items():
                if step == 0:
                    assert not t.any()  # fresh states are zeros
                else:
                    assert torch.equal(t, expected[k, name])
                t.copy_(torch.randn(t.numel(), generator=gen))
                expected[k, name] = t.clone()
    assert store.prefetched == 2 * (len(sizes) - 1)  # passes 2 and 3 read ahead
    out = {n: torch.empty(sizes[2]) for n in ("exp_avg", "exp_avg_sq")}
    store.load(2, out)
    assert torch.equal(out["exp_avg_sq"], expected[2, "exp_avg_sq"])
    assert store.report()["optim_states@nvme"][0] == sum(file_bytes(n, 2) for n in sizes.values())
    assert host.report()["swap_staging"][0] == 2 * slot
    with pytest.raises(ValueError, match="has states"):
        store.ensure(0, ("exp_avg",), 1000)
    store.close()
    assert not os.path.exists(store.path)


def test_zero_config_offload_field(monkeypatch):
    import megalith_zero as zero
    from megalith_zero import offload as glue

    assert zero.ZeroConfig().offload is None
    assert zero.ZeroConfig(offload=OffloadConfig(tier="nvme")).offload.tier == "nvme"
    with pytest.raises(ValueError, match="offload='cpu'; expected None or a megalith_offload"):
        zero.ZeroConfig(offload="cpu")
    monkeypatch.setattr(glue, "megalith_offload", None)  # as if not installed
    with pytest.raises(ImportError, match="pip install megalith-offload"):
        glue.require_offload()


def test_swap_store_one_slot_no_overlap(tmp_path):
    cfg = OffloadConfig(tier="nvme", swap_dir=str(tmp_path), run_name="one")
    store = SwapStore(
        cfg, 0, StateMemory.host(pinned=False), slots=1, slot_bytes=file_bytes(100, 1)
    )
    for k in range(3):
        store.ensure(k, ("m",), 100)
    for _ in range(2):
        for k, states in store.stream(range(3)):
            states["m"].add_(k + 1)
    assert store.prefetched == 0 and not store.overlapped
    out = {"m": torch.empty(100)}
    store.load(2, out)
    assert torch.equal(out["m"], torch.full((100,), 6.0))
    store.close()


def test_visit_frac_balances_host_and_link():
    from megalith_offload.auto import visit_frac_for

    # the 12B on one H200: 1.3 s of host kernel for 6.3B parameters; 12 B each way at
    # about 50 GB/s
    assert visit_frac_for(1.3 / 6.3e9, 12 / 50e9) == 0.46
    assert visit_frac_for(1.0, 1.0) == 0.5 and visit_frac_for(1.0, 3.0) == 0.25
    assert visit_frac_for(1e-12, 1.0) == 0.0  # a fast host keeps every chunk
    assert visit_frac_for(0.0, 1.0) == visit_frac_for(1.0, 0.0) == 0.0  # nothing measured
    assert OffloadConfig(visit_frac="auto").visit_frac == "auto"
    from megalith_offload.auto import host_update_binds

    assert host_update_binds(0.0, 1.65, 1.65)  # kernel hidden from step(), not from the GPU
    assert host_update_binds(0.3, 1.0, 3.0)  # step() waited for part of the kernel
    assert not host_update_binds(0.05, 1.0, 3.0)  # backward hid the update
    with pytest.raises(ValueError, match="visit_frac='some'; expected 0 <= visit_frac <= 1 or"):
        OffloadConfig(visit_frac="some")


def test_offloader_records_and_moves_a_chunk_to_the_device():
    """The Offloader keeps where each chunk is (keyed by chunk index; a key it does not
    plan is on the device) and changes that record only through its own moves."""
    from types import SimpleNamespace

    from megalith_offload import Offloader

    n = 64
    costs = {3: ChunkCost(device=3 * 4 * n, master=4 * n, states=2 * 4 * n, swap=0)}
    off = Offloader(OffloadConfig(tier="host"), costs, rank=0, pinned=False)
    assert off.tier_of(3) == "host" and off.tier_of(0) == "device" and off.tiers == ("host",)
    master = off.host.zeros("master", n).add_(1.0)
    chunk = SimpleNamespace(
        spec=SimpleNamespace(index=3, shard_numel=n),
        shard=torch.zeros(n, dtype=torch.bfloat16),
        memory=StateMemory("cpu"),
        master=master,
        states={"exp_avg": off.host.zeros("optim_states", n).add_(2.0)},
    )
    off.move_to_device(chunk, ("exp_avg", "exp_avg_sq"))
    assert off.tier_of(3) == "device" and chunk.memory.usage("master").current_bytes == 4 * n
    assert torch.equal(chunk.master, torch.ones(n))
    assert torch.equal(chunk.states["exp_avg"], torch.full((n,), 2.0))
    assert not chunk.states["exp_avg_sq"].any()  # never stepped: zeros
    del master
    assert off.report()["master@host"][0] == 0  # the host copies went with their tensors
    off.close()
