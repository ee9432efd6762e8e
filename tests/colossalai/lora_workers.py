"""What each rank runs in tests/colossalai/test_lora.py: LoRA through the Booster against
plain peft on one process (every rank computes the reference on the global batch)."""

from __future__ import annotations

from pathlib import Path

import torch

import megalith_comm as comm
from megalith.booster import Booster
from tests.colossalai.dp_workers import make_plugin

GLOBAL_BATCH, SEQ, VOCAB, STEPS = 6, 8, 64, 3


def base_model() -> torch.nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(
        vocab_size=VOCAB, n_positions=SEQ, n_embd=32, n_layer=2, n_head=2,
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
    )  # fmt: skip
    return GPT2LMHeadModel(config)


def lora_config():
    import peft

    return peft.LoraConfig(r=4, lora_alpha=8, target_modules=["c_attn", "c_proj"], lora_dropout=0.0)


def _batches() -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(2)
    return [torch.randint(0, VOCAB, (GLOBAL_BATCH, SEQ), generator=g) for _ in range(STEPS)]


def _loss(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    return model(input_ids=ids, labels=ids).loss


def _adapter(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {
        n: p.detach().float().cpu().clone() for n, p in model.named_parameters() if "lora_" in n
    }


def lora_run(rank: int, setting: tuple[str, str]) -> dict:
    """Trains LoRA adapters under the plugin; returns the loss and adapter differences
    from plain peft, whether the frozen base weights moved, and how far what peft loads
    from the saved directory is from the trained adapters."""
    import peft

    name, directory = setting
    ref = peft.get_peft_model(base_model(), lora_config())
    ref_opt = torch.optim.AdamW([p for p in ref.parameters() if p.requires_grad], lr=1e-2)
    booster = Booster(plugin=make_plugin(name))
    model = booster.enable_lora(base_model(), lora_config=lora_config())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model, opt, *_ = booster.boost(model, opt)
    w = comm.get_world()
    n = GLOBAL_BATCH // w.world_size
    losses = []
    for ids in _batches():
        ref_loss = _loss(ref, ids)
        ref_loss.backward()
        ref_opt.step()
        ref_opt.zero_grad()
        loss = _loss(model, ids[w.rank * n : (w.rank + 1) * n])
        booster.backward(loss, opt)
        opt.step()
        opt.zero_grad()
        mean = loss.detach().clone()
        comm.all_reduce(mean)
        losses.append(abs(float(mean) / w.world_size - float(ref_loss)))
    user = model.unwrap(unwrap_peft=False)
    got = _adapter(user)
    want = _adapter(ref)
    frozen_changed = max(
        float((p.detach().float() - q.detach().float()).abs().max())
        for (n, p), (_, q) in zip(user.named_parameters(), ref.named_parameters())
        if "lora_" not in n
    )
    booster.save_lora_as_pretrained(model, directory)
    comm.barrier()
    loaded = peft.PeftModel.from_pretrained(base_model(), directory)
    back = _adapter(loaded)
    strip = {k.replace(".default", ""): v for k, v in got.items()}
    back = {k.replace(".default", ""): v for k, v in back.items()}
    return {
        "loss": max(losses),
        "adapter": max(float((got[k] - want[k]).abs().max()) for k in want),
        "same_names": sorted(got) == sorted(want),
        "frozen_changed": frozen_changed,
        "loaded": max(float((back[k] - strip[k]).abs().max()) for k in strip),
        "loaded_names": sorted(back) == sorted(strip),
        "files": sorted(p.name for p in Path(directory).iterdir()),
    }


def mixed(rank: int, setting: tuple[str, object]) -> object:
    kind, arg = setting
    return globals()[kind](rank, arg)
