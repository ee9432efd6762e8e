"""What each rank runs in test_lora_sp_zero.py: peft LoRA adapters on transformers' tiny
Llama and GPT-2 under HybridParallelPlugin with sequence parallelism (Ulysses'
all_to_all over sp, Megatron's split_gather over tp) beside ZeRO stage 1 or 2 over a dp
axis of 2, trained three SGD (momentum) steps from plain peft's adapter values, against
plain peft on one process: the losses, the optimizer state this rank keeps (its dp
shard of the adapters' momentum, nothing for frozen base weights), the adapter saved
with save_lora_as_pretrained."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

import megalith_comm as comm
from tests.finetune.lora_saved_head_workers import saved_state_keys
from tests.finetune.lora_sp_workers import base_model, batch, lora_config, plain_peft
from tests.finetune.workers import step_mean_loss

STEPS, LR, MOMENTUM = 3, 0.2, 0.9


def plugin(mode: str, zero_stage: int) -> Any:
    """dp 2 beside sp 2 (all_to_all) or tp 2 (split_gather) on 4 ranks."""
    from megalith.booster.plugin import HybridParallelPlugin

    if mode == "all_to_all":
        return HybridParallelPlugin(
            tp_size=1, sp_size=2, enable_sequence_parallelism=True,
            sequence_parallelism_mode="all_to_all", zero_stage=zero_stage, precision="fp32",
        )  # fmt: skip
    return HybridParallelPlugin(
        tp_size=2, enable_sequence_parallelism=True, sequence_parallelism_mode="split_gather",
        zero_stage=zero_stage, precision="fp32",
    )  # fmt: skip


def reference(family: str, seed: int) -> tuple[list[float], dict[str, torch.Tensor]]:
    """Plain peft on the whole batch: the losses and the trained adapter (peft's names)."""
    import peft

    model = plain_peft(family, seed)
    opt = torch.optim.SGD(
        [p for p in model.parameters() if p.requires_grad], lr=LR, momentum=MOMENTUM
    )
    ids, losses = batch(seed), []
    for _ in range(STEPS):
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(float(loss.detach()))
    adapter = peft.get_peft_model_state_dict(model)
    return losses, {k: v.detach().clone() for k, v in adapter.items()}


def sp_zero_lora(rank: int, setting: tuple[str, int, str, str, int]) -> dict[str, Any]:
    import peft

    from megalith.booster import Booster

    mode, stage, family, directory, seed = setting
    torch.set_num_threads(1)
    want, _ = reference(family, seed)
    booster = Booster(plugin=plugin(mode, stage))
    model = booster.enable_lora(base_model(family), lora_config=lora_config(family))
    peft.set_peft_model_state_dict(model, peft.get_peft_model_state_dict(plain_peft(family, seed)))
    adapters = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    model, opt, *_ = booster.boost(model, opt)
    # after boost: the adapters as this rank's tp shards hold them
    held = sum(p.numel() for p in model.unwrap(unwrap_peft=False).parameters() if p.requires_grad)
    dp_rank, dp = booster.plugin.dp_rank_size
    ids = batch(seed)
    n = ids.shape[0] // dp
    mine = ids[dp_rank * n : (dp_rank + 1) * n]
    losses = []
    for _ in range(STEPS):
        losses.append(step_mean_loss(booster, opt, model(input_ids=mine, labels=mine).loss))
    state = opt.state
    kept = sum(s.numel() for v in state.values() for s in v.values() if torch.is_tensor(s))
    booster.save_lora_as_pretrained(model, directory)
    booster.save_optimizer(opt, f"{directory}-optim")
    comm.barrier()
    return {
        "loss": max(abs(a - b) / abs(b) for a, b in zip(losses, want)),
        "losses": losses,
        "want": want,
        "dp": dp,
        "held": held,
        "state_numel": kept,
        "state_of_frozen": [tuple(p.shape) for p in state if not p.requires_grad],
        "n_adapters": len(adapters),
        "state_keys": saved_state_keys(Path(f"{directory}-optim")) if rank == 0 else None,
    }
