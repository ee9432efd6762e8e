"""Rank worker: a tensor-parallel model's Booster checkpoint holds full tensors."""

from __future__ import annotations

import torch

from megalith import models
from megalith.booster import Booster
from megalith.booster.plugin import HybridParallelPlugin


def save_and_load(rank: int, path: str):
    model = models.create("llama-tiny", device="cpu", seed=3)
    full = {n: p.detach().clone() for n, p in model.named_parameters()}
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    booster = Booster(plugin=HybridParallelPlugin(tp_size=2))
    tp_model, tp_opt, *_ = booster.boost(model, opt)
    booster.save_model(tp_model, path, shard=True, size_per_shard=1)
    refused = ""
    try:
        booster.save_optimizer(tp_opt, path + "-opt")
    except NotImplementedError as e:
        refused = str(e)
    other = models.create("llama-tiny", device="cpu", seed=4)
    other_model, *_ = Booster(plugin=HybridParallelPlugin(tp_size=2)).boost(
        other, torch.optim.AdamW(other.parameters(), lr=1e-3)
    )
    booster.load_model(other_model, path)
    from megalith.tensor_parallel.state import full_state_dict

    again = full_state_dict(other_model.unwrap())
    return {n: bool(torch.equal(again[n], t)) for n, t in full.items()}, refused
