"""What each rank runs in test_lora_plugins.py: peft LoRA adapters trained through the
Booster against plain peft on one process (every rank computes the reference on the
global batch), the adapter saved with save_lora_as_pretrained, and which tensors the
optimizer keeps state for."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

import megalith_comm as comm
from tests.colossalai.lora_workers import _batches, _loss, base_model, lora_config
from tests.finetune.workers import make_plugin, step_mean_loss


def reference() -> tuple[list[float], dict[str, torch.Tensor]]:
    """Plain peft on one process: the losses and the trained adapter (peft's names)."""
    import peft

    ref = peft.get_peft_model(base_model(), lora_config())
    opt = torch.optim.AdamW([p for p in ref.parameters() if p.requires_grad], lr=1e-2)
    losses = []
    for ids in _batches():
        loss = _loss(ref, ids)
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(float(loss))
    return losses, peft.get_peft_model_state_dict(ref)


def lora_plugin_run(rank: int, setting: tuple[str, str]) -> dict[str, Any]:
    from megalith.booster import Booster
    from megalith.booster.checkpoint_io.lora import full_tensors

    name, directory = setting
    torch.set_num_threads(1)
    want_losses, _ = reference()
    booster = Booster(plugin=make_plugin(name))
    model = booster.enable_lora(base_model(), lora_config=lora_config())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model, opt, *_ = booster.boost(model, opt)
    w = comm.get_world()
    dp = w.world_size if name != "tp2" else 1
    n = _batches()[0].shape[0] // dp
    me = w.rank if dp > 1 else 0
    losses = []
    for ids in _batches():
        losses.append(step_mean_loss(booster, opt, _loss(model, ids[me * n : (me + 1) * n])))
    booster.save_lora_as_pretrained(model, directory)
    full = full_tensors(booster.checkpoint_io, model)  # the writer's; others: empty
    frozen = base_model().state_dict()
    frozen_changed = 0.0
    for k, v in full.items():
        if "lora_" not in k:
            base = k.removeprefix("base_model.model.").replace(".base_layer", "")
            frozen_changed = max(frozen_changed, float((v.float() - frozen[base]).abs().max()))
    booster.save_optimizer(opt, f"{directory}-optim", shard=True)
    comm.barrier()
    index = Path(f"{directory}-optim") / "optimizer.safetensors.index.json"
    if index.is_file():
        keys = list(json.loads(index.read_text())["weight_map"])
    else:
        from safetensors import safe_open

        with safe_open(str(Path(f"{directory}-optim") / "optimizer.safetensors"), "pt") as f:
            keys = list(f.keys())
    return {
        "loss": max(abs(a - b) for a, b in zip(losses, want_losses)),
        "losses": losses,
        "frozen_changed": frozen_changed if full else None,
        "state_keys": keys,
    }
