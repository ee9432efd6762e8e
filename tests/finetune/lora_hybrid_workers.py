"""What each rank runs in test_lora_hybrid.py: peft LoRA adapters on transformers' tiny
GPT-2 and Llama trained under HybridParallelPlugin (tp, pp, tp x pp) against plain peft
on one process (every rank computes the reference), the adapter saved with
save_lora_as_pretrained, how the adapters were split, and which tensors the optimizer
keeps state for."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

import megalith_comm as comm
from tests.finetune.workers import SEQ, VOCAB, build

STEPS, BATCH = 3, 4
#: every linear the policies split (column, row, and Llama's replicated kv rows at tp 2)
TARGETS = {
    "gpt2": ["c_attn", "c_proj", "c_fc"],
    "llama": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
}


def base_model(family: str) -> torch.nn.Module:
    torch.manual_seed(0)
    return build(family)


def lora_config(family: str) -> Any:
    import peft

    return peft.LoraConfig(
        r=4, lora_alpha=8, target_modules=TARGETS[family], lora_dropout=0.0,
        init_lora_weights=False,  # B != 0: the first loss already sees the adapters
    )  # fmt: skip


def batches(seed: int) -> list[torch.Tensor]:
    """One random batch, STEPS times: the loss must fall."""
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, VOCAB, (BATCH, SEQ), generator=g)] * STEPS


def reference(family: str, seed: int) -> tuple[list[float], dict[str, torch.Tensor]]:
    """Plain peft on one process: the losses and the trained adapter (peft's names)."""
    import peft

    torch.manual_seed(1)
    ref = peft.get_peft_model(base_model(family), lora_config(family))
    opt = torch.optim.AdamW([p for p in ref.parameters() if p.requires_grad], lr=1e-2)
    losses = []
    for ids in batches(seed):
        loss = ref(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(float(loss.detach()))
    return losses, {k: v.detach().clone() for k, v in peft.get_peft_model_state_dict(ref).items()}


def plugin(layout: str) -> Any:
    from megalith.booster.plugin import HybridParallelPlugin

    if layout == "tp2zero1":  # world 4: dp 2 x tp 2, ZeRO-1 over dp (both replicas get the batch)
        return HybridParallelPlugin(tp_size=2, zero_stage=1, precision="fp32")
    tp, pp = {"tp2": (2, 1), "pp2": (1, 2), "tp2pp2": (2, 2)}[layout]
    if pp == 1:
        return HybridParallelPlugin(tp_size=tp, precision="fp32")  # vocabulary-parallel loss
    return HybridParallelPlugin(tp_size=tp, pp_size=pp, num_microbatches=2, precision="fp32")


def split_kinds(model: torch.nn.Module) -> dict[str, str]:
    """adapter name -> the class its lora_A / lora_B became."""
    return {
        n: type(m).__name__
        for n, m in model.named_modules()
        if n.endswith(("lora_A.default", "lora_B.default"))
    }


def hybrid_lora(rank: int, setting: tuple[str, str, str, int]) -> dict[str, Any]:
    from megalith.booster import Booster

    layout, family, directory, seed = setting
    torch.set_num_threads(1)
    want_losses, _ = reference(family, seed)
    booster = Booster(plugin=plugin(layout))
    torch.manual_seed(1)
    model = booster.enable_lora(base_model(family), lora_config=lora_config(family))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model, opt, *_ = booster.boost(model, opt)
    pipelined = "pp" in layout
    losses = []
    for ids in batches(seed):
        if pipelined:
            out = booster.execute_pipeline(
                iter([{"input_ids": ids, "labels": ids}]), model, lambda o, b: o.loss, opt
            )
            loss = out["loss"]
        else:
            loss = model(input_ids=ids, labels=ids).loss
            booster.backward(loss, opt)
        opt.step()
        opt.zero_grad()
        losses.append(float(loss.detach()))
    booster.save_lora_as_pretrained(model, directory)
    booster.save_optimizer(opt, f"{directory}-optim")
    comm.barrier()
    keys: list[str] = []
    index = Path(f"{directory}-optim")
    if index.is_file():
        from safetensors import safe_open

        with safe_open(str(index), "pt") as f:
            keys = list(f.keys())
    elif (index / "optimizer.safetensors.index.json").is_file():
        keys = list(
            json.loads((index / "optimizer.safetensors.index.json").read_text())["weight_map"]
        )
    frozen = [n for n, p in model.unwrap(unwrap_peft=False).named_parameters() if p.requires_grad]
    return {
        "loss": max(abs(a - b) for a, b in zip(losses, want_losses)),
        "losses": losses,
        "want": want_losses,
        "kinds": split_kinds(model.unwrap(unwrap_peft=False)),
        "trainable": frozen,
        "state_keys": keys,
    }
