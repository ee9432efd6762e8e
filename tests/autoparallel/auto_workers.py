"""What each rank runs in the AutoPlugin tests: a small GPT trained under whatever the
planner chose, each data-parallel rank on its share of one global batch, and the plain
single-process torch run of the same model and data."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

import megalith_comm as comm

SEQ, BATCH, STEPS, VOCAB = 16, 8, 6, 128
SIZES = {"vocab_size": VOCAB, "d_model": 64, "n_layers": 2, "n_heads": 4, "d_ff": 256}


@dataclass(frozen=True)
class Setting:
    seed: int
    #: "roomy": the planner's free choice; "tight": a device budget just under the roomy
    #: choice's predicted peak, so it must choose something that needs less memory
    budget: str = "roomy"
    #: Booster(plugin="auto") with a DataLoader over a DistributedSampler: the global batch
    #: and the sequence length come from it
    by_name: bool = False
    kwargs: dict[str, Any] = field(default_factory=dict)
    #: transformers' GPT2LMHeadModel of the same sizes instead of megalith's GPT
    hf: bool = False


def make_model(seed: int, hf: bool = False, **overrides: Any) -> torch.nn.Module:
    if hf:
        import transformers

        torch.manual_seed(seed)
        config = transformers.GPT2Config(
            n_layer=SIZES["n_layers"], n_embd=SIZES["d_model"], n_head=SIZES["n_heads"],
            n_inner=SIZES["d_ff"], vocab_size=VOCAB, n_positions=2 * SEQ,
            resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
        )  # fmt: skip
        return transformers.GPT2LMHeadModel(config)
    from megalith import models

    return models.create(
        "gpt-tiny", device="cpu", seed=seed, max_seq_len=2 * SEQ, **{**SIZES, **overrides}
    )


def batches(seed: int) -> list[torch.Tensor]:
    """Two random batches in turn (so that six steps visibly learn them)."""
    g = torch.Generator().manual_seed(seed + 1)
    two = [torch.randint(0, VOCAB, (BATCH, SEQ), generator=g) for _ in range(2)]
    return [two[i % 2] for i in range(STEPS)]


def _optimizer(model: torch.nn.Module) -> torch.optim.Optimizer:
    # SGD with momentum, not Adam: Adam steps every entry by ~lr whatever its gradient's
    # size, so entries whose exact gradient is ~0 move by summation-order noise, which
    # differs between layouts (tests/tensor_parallel/hybrid_options.py has the same note)
    return torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9, weight_decay=0.01)


def plain_losses(seed: int, hf: bool = False) -> list[float]:
    """The model on the whole global batch in one process: the reference."""
    model = make_model(seed, hf)
    opt = _optimizer(model)
    losses = []
    for ids in batches(seed):
        loss = model(ids, labels=ids)[0]
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(float(loss.detach().double()))
    return losses


def _plugin(setting: Setting, **extra: Any) -> Any:
    from megalith.booster import AutoPlugin

    return AutoPlugin(seq_len=SEQ, global_batch_tokens=SEQ * BATCH, **setting.kwargs, **extra)


def auto_train(rank: int, setting: Setting) -> dict[str, Any]:
    """Trains under AutoPlugin; returns the plan (as JSON), the budget and the losses."""
    from megalith.booster import Booster

    model = make_model(setting.seed, setting.hf)
    if setting.by_name:
        return _by_name(rank, setting, model)
    budget = None
    if setting.budget == "tight":
        roomy = _plugin(setting).plan_for(make_model(setting.seed, setting.hf))
        budget = (roomy.chosen.predicted_peak_bytes - 1) / 1e9
        plugin = _plugin(setting, device_budget_gb=budget, memory_headroom=1.0)
    else:
        plugin = _plugin(setting)
    booster = Booster(plugin=plugin)
    opt = _optimizer(model)
    model, opt, *_ = booster.boost(model, opt)
    dp_rank, dp = plugin.dp_rank_size
    per = plugin.plan.per_rank_sequences
    assert per * dp == BATCH, (per, dp)
    losses = []
    device = comm.get_world().device
    for ids in batches(setting.seed):
        mine = ids[dp_rank * per : (dp_rank + 1) * per].to(device)
        loss = model(mine, labels=mine)[0]
        booster.backward(loss, opt)
        opt.step()
        opt.zero_grad()
        t = loss.detach().double()
        comm.all_reduce(t, op="avg")  # a tp group's ranks hold the same loss
        losses.append(float(t))
    return {"plan": plugin.plan.to_json(), "budget": budget, "losses": losses}


def odd_model_on_rank_1(rank: int, seed: int) -> str:
    """Rank 1 builds another model: every rank must fail at the plan, naming the rank."""
    model = make_model(seed, n_layers=3 if rank == 1 else 2)
    try:
        _plugin(Setting(seed)).plan_for(model)
    except ValueError as e:
        return str(e)
    return "planned"


def _by_name(rank: int, setting: Setting, model: torch.nn.Module) -> dict[str, Any]:
    from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

    from megalith.booster import Booster

    n = comm.get_world().world_size
    rows = TensorDataset(torch.cat(batches(setting.seed)))
    sampler = DistributedSampler(rows, num_replicas=n, rank=rank, shuffle=False)
    # each step's batches over the ranks are BATCH consecutive rows: one global batch
    loader = DataLoader(rows, batch_size=BATCH // n, sampler=sampler)
    booster = Booster(plugin="auto")
    opt = _optimizer(model)
    model, opt, _, loader, _ = booster.boost(model, opt, dataloader=loader)
    losses = []
    for (ids,) in loader:
        loss = model(ids, labels=ids)[0]
        booster.backward(loss, opt)
        opt.step()
        opt.zero_grad()
        t = loss.detach().double()
        comm.all_reduce(t, op="avg")
        losses.append(float(t))
    return {"plan": booster.plugin.plan.to_json(), "budget": None, "losses": losses}
