"""What each rank runs in test_lora_lazy.py: peft LoRA adapters on a model built in
LazyInitContext (booster.enable_lora after the context, peft.get_peft_model inside it,
a checkpoint loaded before boost either side of enable_lora), boosted and trained three
SGD steps on half the batch each, against the eager peft model built from the same
seed (or weights) trained on the whole batch on one process: the losses, the adapters
after the first step (its gradient: plain SGD) and at the end, the base weights (eager
construction's, bit for bit, and frozen); before boost, the adapters real and the base
weights lazy; whether boost materialised the whole model at once."""

from __future__ import annotations

from typing import Any

import torch

import megalith_comm as comm
from tests.finetune.lora_hybrid_workers import lora_config
from tests.finetune.workers import SEQ, VOCAB, build, step_mean_loss

STEPS, BATCH, LR = 3, 4, 1.0
#: the seed offset peft draws its adapters from where the caller reseeds before them
RESEED = 7
#: a peft model's names begin with it (some plugins' full tensors leave it out)
PEFT_PREFIX = "base_model.model."


def batch(seed: int) -> torch.Tensor:
    return torch.randint(0, VOCAB, (BATCH, SEQ), generator=torch.Generator().manual_seed(seed))


def eager_peft(family: str, how: str, seed: int, path: str | None) -> Any:
    """The eager model `how` stands for: built (or loaded) then peft's adapters drawn."""
    import peft

    base = plain_base(family, seed, path)
    if how == "reseeded" or path is not None:
        torch.manual_seed(seed + RESEED)
    return peft.get_peft_model(base, lora_config(family))


def trained_logits(family: str, how: str, seed: int, path: str | None) -> torch.Tensor:
    """The eager peft model trained as the ranks train theirs: its logits on the batch."""
    model = eager_peft(family, how, seed, path)
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=LR)
    ids = batch(seed)
    for _ in range(STEPS):
        model(input_ids=ids, labels=ids).loss.backward()
        opt.step()
        opt.zero_grad()
    with torch.no_grad():
        return model(input_ids=ids).logits


def plain_base(family: str, seed: int, path: str | None) -> torch.nn.Module:
    """The eager base model a saved adapter loads into."""
    import transformers

    if path is not None:
        return transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    torch.manual_seed(seed)
    return build(family)


def lazy_peft(booster: Any, family: str, how: str, seed: int, path: str | None) -> Any:
    import peft

    from megalith.lazy import LazyInitContext

    cfg = lora_config(family)
    torch.manual_seed(seed if path is None else seed + 1)  # a checkpoint: not its weights
    with LazyInitContext():
        model = build(family)
        if how == "inside":
            model = peft.get_peft_model(model, cfg)
    if how == "inside":
        return model
    if how == "peft_after_context":
        return peft.get_peft_model(model, cfg)
    if how == "load_first":
        booster.load_model(model, path)
    if how != "enable_lora":
        torch.manual_seed(seed + RESEED)
    model = booster.enable_lora(model, lora_config=cfg)
    if how == "lora_first":
        booster.load_model(model, path)
    return model


def plugin(name: str) -> Any:
    from megalith.booster.plugin import HybridParallelPlugin
    from tests.finetune.lazy_shard_workers import plugin_for

    if name == "hybrid-tp1":  # dp 2, materialised whole at boost
        return HybridParallelPlugin(tp_size=1, precision="fp32")
    if name == "hybrid-tp2":  # dp 1, materialised straight into the tp shards
        return HybridParallelPlugin(tp_size=2, precision="fp32", parallel_output=False)
    return plugin_for(name)


def _relative(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got - want).abs().max() / want.abs().max().clamp_min(1e-30))


def _step_error(before: torch.Tensor, got: torch.Tensor, want: torch.Tensor) -> float:
    """The error of one plain SGD step's change (LR x the gradient) relative to its
    largest, beyond what storing the two results in fp32 may add (an ulp each of the
    largest value: the step is small beside the weights it changes)."""
    slack = 2 * torch.finfo(torch.float32).eps * float(torch.stack([got, want]).abs().max())
    excess = max(0.0, float((got - want).abs().max()) - slack)
    return excess / float((want - before).abs().max())


def _snapshot(booster: Any, model: Any) -> dict[str, torch.Tensor]:
    """Every tensor of the boosted model, whole, on the writer (collective)."""
    from megalith.booster.checkpoint_io.lora import full_tensors

    got = full_tensors(booster.checkpoint_io, model)
    return {k.removeprefix(PEFT_PREFIX): v.detach().clone() for k, v in got.items()}


def lazy_lora(rank: int, setting: tuple[str, str, str, int, str | None, str]) -> dict[str, Any]:
    from megalith.booster import Booster
    from megalith.lazy import context

    plugin_name, family, how, seed, path, directory = setting
    torch.set_num_threads(1)
    ids = batch(seed)
    # the reference: plain peft on the whole batch
    ref = eager_peft(family, how, seed, path)
    named = {n.removeprefix(PEFT_PREFIX): p for n, p in ref.named_parameters()}
    opt = torch.optim.SGD([p for p in ref.parameters() if p.requires_grad], lr=LR)
    want_losses: list[float] = []
    want_after: list[dict[str, torch.Tensor]] = []
    start = {n: p.detach().clone() for n, p in named.items()}
    for _ in range(STEPS):
        loss = ref(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
        want_losses.append(float(loss.detach()))
        want_after.append({n: p.detach().clone() for n, p in named.items() if p.requires_grad})

    booster = Booster(plugin=plugin(plugin_name))
    model = lazy_peft(booster, family, how, seed, path)
    lora = {n: p for n, p in model.named_parameters() if "lora_" in n}
    base_named = [(n, p) for n, p in model.named_parameters() if "lora_" not in n]
    base = [p for _, p in base_named]
    before = {
        "adapters_real": bool(lora) and not any(p.is_meta for p in lora.values()),
        "base_lazy": all(p.is_meta for p in base),
    }
    whole: list[int] = []
    original = context._materialize

    def spy(module: Any, verbose: bool, sliced: bool) -> Any:
        whole.append(sum(p.numel() for p in module.parameters() if p.is_meta))
        return original(module, verbose, sliced)

    opt = torch.optim.SGD(model.parameters(), lr=LR)
    context._materialize = spy
    try:
        model, opt, *_ = booster.boost(model, opt)
    except ValueError as e:
        return {"refused": str(e)}
    finally:
        context._materialize = original
    if plugin_name == "hybrid-tp2":  # the full base weights a tp shard replaced
        kept = {id(p) for p in model.unwrap(unwrap_peft=False).parameters()}
        replaced = [(n, p) for n, p in base_named if id(p) not in kept]
        before["n_replaced"] = len(replaced)
        before["full_made_real"] = [n for n, p in replaced if not p.is_meta]
    w = comm.get_world()
    dp_rank, dp = getattr(booster.plugin, "dp_rank_size", (w.rank, w.world_size))
    n = BATCH // dp  # tp ranks of a replica see the same rows
    mine = ids[dp_rank * n : (dp_rank + 1) * n]
    losses, snapshots = [], []
    for step in range(STEPS):
        losses.append(step_mean_loss(booster, opt, model(input_ids=mine, labels=mine).loss))
        if step in (0, STEPS - 1):
            snapshots.append(_snapshot(booster, model))
    booster.save_lora_as_pretrained(model, directory)
    out: dict[str, Any] = {
        **before,
        "whole_materialised": whole,
        "loss": max(abs(a - b) / abs(b) for a, b in zip(losses, want_losses)),
        "losses": losses,
        "want": want_losses,
    }
    first, last = snapshots
    if not first or rank:  # the writer's
        return out
    adapters = [k for k in named if "lora_" in k]
    out["missing"] = [k for k in adapters if k not in first]
    # one plain SGD step: the change is -LR x the gradient
    out["grad_error"] = max(_step_error(start[k], first[k], want_after[0][k]) for k in adapters)
    out["adapter_error"] = max(_relative(last[k], want_after[-1][k]) for k in adapters)
    out["adapters"] = {k: last[k] for k in adapters}
    frozen = [k for k in named if "lora_" not in k and k in last]
    out["n_base"] = len(frozen)
    out["base_unequal"] = [
        k
        for k in frozen
        if not (torch.equal(first[k], start[k]) and torch.equal(last[k], start[k]))
    ]
    return out
