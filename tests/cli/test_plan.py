"""`megalith plan` and megalith_zero.estimate: the training state's bytes per rank, from a
model on the meta device (nothing allocated), against the ZeRO formulas: per parameter
2 bytes of bf16 working params and 2 of gradients (divided by the world where stage 2
and 3 shard them) and 12 of fp32 master and Adam states (divided by the world), moved
off the device by offloading."""

from __future__ import annotations

import pytest
import torch

import megalith_zero as zero
from megalith import models
from megalith.cli.main import main
from megalith_offload import OffloadConfig
from megalith_zero.estimate import estimate


def _gpt(layers: int = 4):
    model = models.create("gpt-1.3b", n_layers=layers)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-4)


def _close(got: float, want: float) -> bool:  # chunk padding adds a little
    return want <= got <= want * 1.01 + 4096 * 64


@pytest.mark.parametrize(("stage", "world"), [(1, 1), (2, 4), (3, 3)])
def test_device_bytes_follow_the_zero_formulas(stage, world):
    model, opt = _gpt()
    n = sum(p.numel() for p in model.parameters())
    e = estimate(model, opt, zero.ZeroConfig(stage=stage, precision="bf16"), world)
    assert e.params == n and e.tiers == {"device": e.chunks}
    assert _close(e.device["params"], 2 * n / (world if stage == 3 else 1))
    assert _close(e.device["grads"], 2 * n / (1 if stage == 1 else world))
    assert _close(e.device["masters_and_states"], 12 * n / world)
    assert (e.device["gathered"] > 0) == (stage == 3)
    assert e.host_bytes == e.nvme_bytes == 0


def test_offloading_moves_masters_and_states_off_the_device():
    model, opt = _gpt()
    n = sum(p.numel() for p in model.parameters())
    host = OffloadConfig(tier="host")
    e = estimate(model, opt, zero.ZeroConfig(stage=2, offload=host), 2)
    assert e.tiers == {"host": e.chunks} and e.device["masters_and_states"] == 0
    assert e.host_bytes >= 12 * n / 2  # masters and states, plus the update's staging
    # NVMe: masters in host memory, or in the files beside the states
    plans = [
        estimate(model, opt, zero.ZeroConfig(stage=3, precision="bf16", offload=cfg), 2)
        for cfg in (OffloadConfig(tier="nvme"), OffloadConfig(tier="nvme", master_tier="nvme"))
    ]
    assert _close(plans[0].nvme_bytes, 8 * n / 2) and _close(plans[1].nvme_bytes, 12 * n / 2)
    # the host keeps the staging: one more vector, the largest shard's fp32 master (the
    # chunk's bf16 bytes at world 2), in each of the two swap buffers
    moved = plans[0].host_bytes - plans[1].host_bytes
    assert _close(moved + 2 * plans[1].chunk_bytes, 4 * n / 2), (moved, n)
    # automatic placement at stage 3 plans its warm-up: parameter shards on the host too
    auto = OffloadConfig(placement="auto")
    e = estimate(model, opt, zero.ZeroConfig(stage=3, offload=auto), 2)
    assert e.device["params"] == 0 and e.host_bytes >= 14 * n / 2


def test_cli_prints_the_plan_and_says_whether_it_fits(capsys):
    words = ["plan", "--model", "gpt-1.3b", "--layers", "4", "--offload", "host"]
    assert main([*words, "--gpu-gb", "80"]) == 0
    out = capsys.readouterr().out
    assert "chunks' masters and states per tier: host" in out
    assert "on a 80 GB device: fits" in out
    assert main([*words, "--gpu-gb", "0.5"]) == 1  # too small: says by how much and what to do
    assert "does not fit" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="param_tier='nvme' with tier='host'"):
        main([*words, "--param-frac", "0.5", "--param-tier", "nvme", "--stage", "3"])
