"""boost() (and megalith_zero.shard) of an optimizer that has already stepped continues
exactly where it was: its step counts, exp_avg / exp_avg_sq and param-group
hyperparameters carry over into tp shards, pipeline stages and ZeRO's chunk shards, so
training after boost equals plain torch continuing with that optimizer (ColossalAI's
test_3d_plugin boosts its reference model this way; so do resumed scripts).

Every rank trains a tiny GPT-2 plainly for a few steps, changes a param group's lr,
boosts the model and the stepped optimizer, and trains on; a copy of the model with the
optimizer's state_dict loaded into a plain torch AdamW trains on the whole batches in
the same process. The losses must agree to 1e-6 relative (fp32) after every step.
"""

from __future__ import annotations

import copy
import os
from dataclasses import dataclass

import pytest
import torch

VOCAB, SEQ, ROWS = 64, 8, 12  # 12 rows: whole micro-batches at dp 1, 2 and 3
BEFORE, AFTER = 2, 3  # plain steps before boost(), boosted steps after


@dataclass(frozen=True)
class Case:
    plugin: str  # "hybrid", "lowlevel", "gemini", "shard" (megalith_zero.shard itself)
    tp: int = 1
    pp: int = 1
    zero: int = 0
    layers: int = 2
    offload: bool = False  # fp32 masters and states in host memory (their own tier)
    #: megalith's CPUAdam with lean states (bf16 / int8): the losses agree within what
    #: the format rounds (int8 blocks follow the layout: [Note: lean chunk states])
    state_dtype: str = "fp32"

    @property
    def tol(self) -> float:
        return 1e-6 if self.state_dtype == "fp32" else 1e-4

    def optimizer(self, model: torch.nn.Module) -> torch.optim.Optimizer:
        if self.state_dtype == "fp32":
            return torch.optim.AdamW(groups(model), lr=1e-2)
        from megalith.nn.optimizer import CPUAdam

        return CPUAdam(groups(model), lr=1e-2, adamw_mode=True, state_dtype=self.state_dtype)


def build(layers: int) -> torch.nn.Module:
    import transformers as tf

    torch.manual_seed(0)
    cfg = tf.GPT2Config(
        vocab_size=VOCAB, n_positions=SEQ, n_embd=32, n_layer=layers, n_head=4,
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
    )  # fmt: skip
    return tf.GPT2LMHeadModel(cfg)


def groups(model: torch.nn.Module) -> list[dict]:
    decay = [p for n, p in model.named_parameters() if p.dim() > 1]
    rest = [p for n, p in model.named_parameters() if p.dim() <= 1]
    return [{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}]


def fresh_seed() -> int:
    import megalith_comm as comm

    seed = torch.tensor([int.from_bytes(os.urandom(3), "little")])
    comm.broadcast(seed, src=0)
    print(f"seed={int(seed)}")
    return int(seed)


def boosted(case: Case, model, opt):
    """(step function taking the rank's rows, dp rank, dp size) for the case."""
    import megalith_comm as comm
    import megalith_zero as zero
    from megalith.booster import Booster
    from megalith.booster.plugin import GeminiPlugin, HybridParallelPlugin, LowLevelZeroPlugin

    world = comm.get_world()
    if case.plugin == "shard":
        zmodel, zopt = zero.shard(model, opt, zero.ZeroConfig(stage=case.zero))

        def step(ids):
            loss = zmodel(ids, labels=ids).loss
            zopt.backward(loss)
            zopt.step()
            zopt.zero_grad()
            return loss

        return step, world.rank, world.world_size
    if case.plugin == "hybrid":
        plugin = HybridParallelPlugin(
            tp_size=case.tp, pp_size=case.pp, zero_stage=case.zero, precision="fp32",
            num_microbatches=2 if case.pp > 1 else None, cpu_offload=case.offload,
        )  # fmt: skip
    elif case.plugin == "lowlevel":
        plugin = LowLevelZeroPlugin(stage=case.zero, precision="fp32", cpu_offload=case.offload)
    else:
        plugin = GeminiPlugin(precision="fp32", tp_size=case.tp)
    booster = Booster(plugin=plugin)
    model, opt, *_ = booster.boost(model, opt)
    dp_rank, dp = getattr(plugin, "dp_rank_size", (world.rank // case.tp, world.world_size // case.tp))  # fmt: skip

    def step(ids):
        if case.pp > 1:
            batch = iter([{"input_ids": ids, "labels": ids}])
            out = booster.execute_pipeline(batch, model, lambda o, _: o.loss, opt)
            loss = out["loss"]
        else:
            loss = model(ids, labels=ids).loss
            booster.backward(loss, opt)
        opt.step()
        opt.zero_grad()
        return loss

    return step, dp_rank, dp


def run(rank: int, case: Case) -> list[str]:
    import megalith_comm as comm

    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(fresh_seed())
    batches = [torch.randint(0, VOCAB, (ROWS, SEQ), generator=gen) for _ in range(BEFORE + AFTER)]
    model = build(case.layers)
    opt = case.optimizer(model)
    for ids in batches[:BEFORE]:  # the user's own training, before boost()
        model(ids, labels=ids).loss.backward()
        opt.step()
        opt.zero_grad()
    opt.param_groups[1]["lr"] = 3e-3  # a scheduler's or the user's change: kept
    ref = copy.deepcopy(model)
    ref_opt = case.optimizer(ref)
    ref_opt.load_state_dict(copy.deepcopy(opt.state_dict()))  # plain torch continuing
    step, dp_rank, dp = boosted(case, model, opt)
    errors = []
    for i, ids in enumerate(batches[BEFORE:]):
        want = ref(ids, labels=ids).loss
        want.backward()
        ref_opt.step()
        ref_opt.zero_grad()
        loss = step(ids.chunk(dp)[dp_rank]).detach().reshape(1).float()
        # every rank of a dp replica (its tp and pp ranks) holds the replica's loss, so the
        # world's average is the dp average
        comm.all_reduce(loss, op="avg")
        want = want.detach()
        err = abs(float(loss) - float(want)) / abs(float(want))
        if not err < case.tol:
            errors.append(f"step {i} after boost: loss {float(loss)} vs torch {float(want)}")
    return errors


def run_case(rank: int, case: Case) -> list[str]:
    try:
        return run(rank, case)
    except Exception as e:
        import traceback

        return [f"raised {e!r}\n{traceback.format_exc()}"]


WORLD2 = [
    Case("shard", zero=2),
    Case("shard", zero=3),
    Case("lowlevel", zero=1),
    Case("lowlevel", zero=2, offload=True),
    Case("gemini"),
    Case("gemini", tp=2),
    Case("hybrid", tp=2),
    Case("hybrid", tp=2, zero=1),
    Case("hybrid", tp=2, zero=2, offload=True),
    Case("hybrid", pp=2),
    Case("hybrid", pp=2, zero=1),
]
WORLD3 = [  # uneven shards
    Case("shard", zero=3),
    Case("shard", zero=2, state_dtype="int8"),  # q8 per-parameter states into chunks
    Case("lowlevel", zero=2),
    Case("gemini"),
    Case("hybrid", zero=1),
    Case("hybrid", zero=2),
    Case("hybrid", pp=3, layers=3),
]


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("world", "cases"), [(2, WORLD2), (3, WORLD3)], ids=["world2", "world3"])
def test_boost_continues_a_stepped_optimizer(world, cases):
    from megalith.testing import run_grid

    results = run_grid(run_case, cases, world, timeout=110)
    failures = [
        f"{case} rank {r}: {e}"
        for case, per_rank in zip(cases, results)
        for r, errs in enumerate(per_rank)
        for e in errs[:2]
    ]
    assert not failures, "\n".join(failures)
