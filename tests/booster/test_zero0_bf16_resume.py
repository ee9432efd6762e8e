"""HybridParallelPlugin(zero_stage=0, precision="bf16") with a bf16 model keeps fp32
master weights and fp32 optimizer states (ColossalAI's HybridParallelAMPOptimizer).
Loading an optimizer checkpoint must keep the states fp32, bit for bit what was saved
(torch's Optimizer.load_state_dict casts every state to its parameter's dtype: bf16
here), and training resumed from the checkpoint must equal the uninterrupted run.

A load takes the masters again from the (bf16) parameters, as ColossalAI's does
(update_master_params); the uninterrupted run does the same at the save point, so both
continue from the same masters and states and must agree exactly.
"""

from __future__ import annotations

import copy
import os
from dataclasses import dataclass

import pytest
import torch

VOCAB, SEQ, ROWS = 64, 8, 4
BEFORE, AFTER = 2, 2


@dataclass(frozen=True)
class Case:
    tp: int
    path: str
    via: str = "booster"  # "booster": save/load_optimizer; "state_dict": load_state_dict


def build() -> torch.nn.Module:
    import transformers as tf

    torch.manual_seed(0)
    cfg = tf.GPT2Config(
        vocab_size=VOCAB, n_positions=SEQ, n_embd=32, n_layer=2, n_head=4,
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
    )  # fmt: skip
    return tf.GPT2LMHeadModel(cfg).to(torch.bfloat16)


def boosted(case: Case):
    from megalith.booster import Booster
    from megalith.booster.plugin import HybridParallelPlugin

    plugin = HybridParallelPlugin(tp_size=case.tp, zero_stage=0, precision="bf16")
    booster = Booster(plugin=plugin)
    model = build()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    model, opt, *_ = booster.boost(model, opt)
    return booster, model, opt, plugin.dp_rank_size


def train(booster, model, opt, dp, batches) -> list[float]:
    import megalith_comm as comm

    dp_rank, size = dp
    losses = []
    for ids in batches:
        mine = ids.chunk(size)[dp_rank]
        loss = model(mine, labels=mine).loss
        booster.backward(loss, opt)
        opt.step()
        opt.zero_grad()
        loss = loss.detach().float().reshape(1)
        comm.all_reduce(loss, op="avg")
        losses.append(float(loss))
    return losses


def states(opt) -> dict[tuple[int, str], torch.Tensor]:
    out = {}
    for i, p in enumerate(q for g in opt.param_groups for q in g["params"]):
        for k, v in opt.optim.state.get(p, {}).items():
            if k != "step":
                out[(i, k)] = v.detach().clone()
    return out


def run(rank: int, case: Case) -> list[str]:
    import megalith_comm as comm

    torch.set_num_threads(1)
    seed = torch.tensor([int.from_bytes(os.urandom(3), "little")])
    comm.broadcast(seed, src=0)
    print(f"seed={int(seed)}")
    gen = torch.Generator().manual_seed(int(seed))
    batches = [torch.randint(0, VOCAB, (ROWS, SEQ), generator=gen) for _ in range(BEFORE + AFTER)]
    booster, model, opt, dp = boosted(case)
    train(booster, model, opt, dp, batches[:BEFORE])
    saved = states(opt)
    errors = [f"state {k} saved as {v.dtype}" for k, v in saved.items() if v.dtype != torch.float32]
    if case.via == "booster":
        booster.save_model(model, case.path + "/model")
        booster.save_optimizer(opt, case.path + "/optim")
    else:
        # copies: torch's state dicts hold the live tensors, which training goes on to change
        sd, msd = copy.deepcopy(opt.state_dict()), copy.deepcopy(model.unwrap().state_dict())
    opt.update_master_params(model)  # as a load does: masters from the bf16 parameters
    want = train(booster, model, opt, dp, batches[BEFORE:])
    booster, model, opt, dp = boosted(case)
    if case.via == "booster":
        booster.load_model(model, case.path + "/model")
        booster.load_optimizer(opt, case.path + "/optim")
    else:
        model.unwrap().load_state_dict(msd)
        opt.load_state_dict(sd)
    loaded = states(opt)
    if loaded.keys() != saved.keys():
        errors.append(f"{len(loaded)} states loaded, {len(saved)} saved")
    for k, v in loaded.items():
        if v.dtype != torch.float32:
            errors.append(f"state {k} loaded as {v.dtype}")
        elif k in saved and not torch.equal(v, saved[k]):
            errors.append(f"state {k} loaded differs from the saved one")
    got = train(booster, model, opt, dp, batches[BEFORE:])
    if got != want:
        errors.append(f"resumed losses {got} vs uninterrupted {want}")
    return errors[:4]


def run_case(rank: int, case: Case) -> list[str]:
    try:
        return run(rank, case)
    except Exception as e:
        import traceback

        return [f"raised {e!r}\n{traceback.format_exc()}"]


@pytest.mark.timeout(90)
def test_zero0_bf16_resume_keeps_fp32_states(tmp_path):
    from megalith.testing import run_grid

    cases = [
        Case(tp=1, path=str(tmp_path / "dp2")),  # dp 2
        Case(tp=2, path=str(tmp_path / "tp2")),  # tp 2: the states' tp shards
        Case(tp=2, path="", via="state_dict"),  # the boosted optimizer's load_state_dict
    ]
    results = run_grid(run_case, cases, 2, timeout=80)
    failures = [
        f"{case} rank {r}: {e}"
        for case, per_rank in zip(cases, results)
        for r, errs in enumerate(per_rank)
        for e in errs
    ]
    assert not failures, "\n".join(failures)
