"""What each rank runs in test_lora_saved_head.py: peft LoRA adapters plus a trainable
copy of the head (LoraConfig(modules_to_save=[...])): the LM head of transformers' tiny
Llama ("llama") or the classifier score of its sequence-classification model
("llama-cls"), built in LazyInitContext (and given a checkpoint by booster.load_model before or
after enable_lora), boosted and trained three SGD (momentum) steps on this replica's
rows, against eager peft from the same seed (or checkpoint) on the whole batch:
the losses, the first step's change of every trainable tensor (the head's copy
included), the trained copy, which tensors the optimizer keeps state for, and the
adapter save_lora_as_pretrained writes."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import torch

import megalith_comm as comm
from tests.finetune.lora_hybrid_workers import lora_config
from tests.finetune.lora_lazy_workers import (
    BATCH,
    PEFT_PREFIX,
    RESEED,
    STEPS,
    _relative,
    _snapshot,
    _step_error,
    batch,
    plain_base,
    plugin,
)
from tests.finetune.workers import build, config, step_mean_loss

LR, MOMENTUM = 0.5, 0.9
HEADS = {"llama": "lm_head", "llama-cls": "score"}
CLASSES = 3


def copy_name(family: str) -> str:
    """The head's trainable copy, as peft names it (PEFT_PREFIX left out)."""
    return f"{HEADS[family]}.modules_to_save.default.weight"


def head_config(family: str) -> Any:
    cfg = copy.deepcopy(lora_config("llama"))
    cfg.modules_to_save = [HEADS[family]]
    return cfg


def build_base(family: str) -> torch.nn.Module:
    if family == "llama":
        return build("llama")
    import transformers

    cfg = config("llama")
    cfg.num_labels, cfg.pad_token_id = CLASSES, 0
    return transformers.LlamaForSequenceClassification(cfg)


def labels(family: str, seed: int) -> torch.Tensor:
    """The next tokens for the LM, a class per row for the classifier."""
    if family == "llama":
        return batch(seed)
    return torch.randint(0, CLASSES, (BATCH,), generator=torch.Generator().manual_seed(seed + 3))


def eager_base(family: str, seed: int, path: str | None) -> torch.nn.Module:
    if path is not None or family == "llama":
        return plain_base(family, seed, path)
    torch.manual_seed(seed)
    return build_base(family)


def trainable(model: torch.nn.Module) -> list[torch.nn.Parameter]:
    return [p for p in model.parameters() if p.requires_grad]


def reference(family: str, seed: int, path: str | None) -> dict[str, Any]:
    """Eager peft on the whole batch: losses, trainable tensors before, after the first
    step and at the end (names without PEFT_PREFIX), and the trained logits."""
    import peft

    base = eager_base(family, seed, path)
    if path is not None:  # adapters drawn where lazy_model draws them
        torch.manual_seed(seed + RESEED)
    model = peft.get_peft_model(base, head_config(family))
    named = {n.removeprefix(PEFT_PREFIX): p for n, p in model.named_parameters() if p.requires_grad}
    opt = torch.optim.SGD(trainable(model), lr=LR, momentum=MOMENTUM)
    ids, targets, losses, after = batch(seed), labels(family, seed), [], []
    start = {n: p.detach().clone() for n, p in named.items()}
    for _ in range(STEPS):
        loss = model(input_ids=ids, labels=targets).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(float(loss.detach()))
        after.append({n: p.detach().clone() for n, p in named.items()})
    with torch.no_grad():
        logits = model(input_ids=ids).logits
    return {"losses": losses, "start": start, "after": after, "logits": logits}


def saved_state_keys(path: Path) -> list[str]:
    """The parameter names an optimizer checkpoint holds states for (one file or an index)."""
    if path.is_file():
        from safetensors import safe_open

        with safe_open(str(path), "pt") as f:
            return list(f.keys())
    index = path / "optimizer.safetensors.index.json"
    return list(json.loads(index.read_text())["weight_map"]) if index.is_file() else []


def lazy_model(booster: Any, family: str, how: str, seed: int, path: str | None) -> Any:
    """The lazily built peft model: how "lazy" (no checkpoint), "load_first" or
    "lora_first" (booster.load_model(path) before or after enable_lora)."""
    from megalith.lazy import LazyInitContext

    torch.manual_seed(seed if path is None else seed + 1)  # a checkpoint: not its weights
    with LazyInitContext():
        base = build_base(family)
    if how == "load_first":
        booster.load_model(base, path)
    if path is not None:
        torch.manual_seed(seed + RESEED)
    model = booster.enable_lora(base, lora_config=head_config(family))
    if how == "lora_first":
        booster.load_model(model, path)
    return model


def saved_head(rank: int, setting: tuple[str, str, str, int, str | None, str]) -> dict[str, Any]:
    from megalith.booster import Booster

    plugin_name, family, how, seed, path, directory = setting
    torch.set_num_threads(1)
    want = reference(family, seed, path)
    booster = Booster(plugin=plugin(plugin_name))
    try:
        model = lazy_model(booster, family, how, seed, path)
        opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
        model, opt, *_ = booster.boost(model, opt)
    except ValueError as e:
        return {"refused": str(e)}
    dp_rank, dp = booster.plugin.dp_rank_size
    n = BATCH // dp
    ids = batch(seed)
    mine = ids[dp_rank * n : (dp_rank + 1) * n]
    targets = labels(family, seed)[dp_rank * n : (dp_rank + 1) * n]
    pipelined = plugin_name.startswith("pp")
    losses, snapshots = [], []
    for step in range(STEPS):
        if pipelined:  # forward and backward; every rank gets the loss
            data = iter([{"input_ids": mine, "labels": targets}])
            loss = booster.execute_pipeline(data, model, lambda out, _: out.loss, opt)["loss"]
        else:
            loss = model(input_ids=mine, labels=targets).loss
        losses.append(step_mean_loss(booster, opt, loss, backward=not pipelined))
        if step in (0, STEPS - 1):
            snapshots.append(_snapshot(booster, model))
    logits = None
    if not pipelined:
        with torch.no_grad():
            logits = model.eval()(input_ids=ids).logits
    booster.save_lora_as_pretrained(model, directory)
    booster.save_optimizer(opt, f"{directory}-optim")
    comm.barrier()
    out: dict[str, Any] = {
        "loss": max(abs(a - b) / abs(b) for a, b in zip(losses, want["losses"])),
        "losses": losses,
        "want": want["losses"],
        "logits": logits,
        "logits_error": None if logits is None else _relative(logits, want["logits"]),
    }
    first, last = snapshots
    if rank:  # the writer's
        return out
    names = list(want["start"])
    out["missing"] = [k for k in names if k not in first]
    out["step_error"] = {
        k: _step_error(want["start"][k], first[k], want["after"][0][k]) for k in names
    }
    out["trained_error"] = {k: _relative(last[k], want["after"][-1][k]) for k in names}
    saved = copy_name(family)
    out["copy_moved"] = float((last[saved] - want["start"][saved]).abs().max())
    out["original_kept"] = bool(
        torch.equal(last[f"{HEADS[family]}.original_module.weight"], want["start"][saved])
    )
    out["state_keys"] = saved_state_keys(Path(f"{directory}-optim"))
    return out
