"""TorchFSDPPlugin's boost() of an optimizer that has already stepped (a resumed script,
a warm-up before boost) continues exactly where it was: each parameter's states
(exp_avg, exp_avg_sq, max_exp_avg_sq, momentum_buffer) become this rank's Shard(0)
slices of FSDP2's DTensor parameters (uneven at world 3, an empty one included), step
counts and param-group hyperparameters are kept, and an LR scheduler built before
boost() keeps driving it.

Every rank builds the same small model twice from a fresh seed: one trains plainly for
all the steps on the whole batches; the other trains plainly for BEFORE steps, is
boosted with its stepped optimizer and trains on its rank's rows. Losses, parameters and
the boosted optimizer's (full) state_dict() must equal the plain run's (fp32, 1e-5
relative). A state FSDP cannot slice as its parameter (Adafactor's factored moments) is
refused before anything is sharded.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import pytest
import torch

ROWS = 12  # whole rank shares at world 2 and 3
BEFORE, AFTER = 2, 3  # plain steps before boost(), boosted steps after


@dataclass(frozen=True)
class Case:
    #: "adam", "adamw", "sgd", megalith's "hybridadam" (stepped through FSDPOptimizer's
    #: fp32 shadows), refused: "adafactor" (factored states), "cpuadam-int8" (quantised
    #: blocks)
    optimizer: str
    scheduler: str = ""  # "step", "lambda"
    wrap: bool = False  # each Linear its own FSDP unit (auto_wrap_policy), params offloaded


def build(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    # out features 7, 5 and 2: uneven Shard(0) slices at world 3, the last one empty
    return torch.nn.Sequential(
        torch.nn.Linear(6, 7), torch.nn.Tanh(), torch.nn.Linear(7, 5), torch.nn.Tanh(),
        torch.nn.Linear(5, 2),
    )  # fmt: skip


def make_optimizer(case: Case, model: torch.nn.Module) -> torch.optim.Optimizer:
    weights = [p for p in model.parameters() if p.dim() > 1]
    biases = [p for p in model.parameters() if p.dim() == 1]
    if case.optimizer == "adam":
        return torch.optim.Adam(model.parameters(), lr=2e-2, betas=(0.8, 0.95))
    if case.optimizer == "adamw":
        return torch.optim.AdamW(
            [
                {"params": weights, "weight_decay": 0.1, "amsgrad": True},
                {"params": biases, "weight_decay": 0.0, "betas": (0.7, 0.9)},
            ],
            lr=2e-2,
        )
    if case.optimizer == "sgd":
        return torch.optim.SGD(
            [
                {"params": weights, "weight_decay": 0.05, "nesterov": True},
                {"params": biases, "lr": 3e-2, "dampening": 0.1},
            ],
            lr=5e-2,
            momentum=0.9,
        )
    if case.optimizer == "hybridadam":
        from megalith.nn.optimizer import HybridAdam

        return HybridAdam(model.parameters(), lr=2e-2, weight_decay=0.01)
    if case.optimizer.startswith("cpuadam-"):
        from megalith.nn.optimizer import CPUAdam

        lean = case.optimizer.split("-")[1]
        return CPUAdam(model.parameters(), lr=2e-2, state_dtype=lean)
    return torch.optim.Adafactor(model.parameters(), lr=1e-2)


REFUSED = {"adafactor": "row_var", "cpuadam-int8": "state_dtype="}


def make_scheduler(case: Case, opt: torch.optim.Optimizer):
    if case.scheduler == "step":
        return torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
    if case.scheduler == "lambda":
        return torch.optim.lr_scheduler.LambdaLR(opt, lambda i: 1.0 / (1 + i))
    return None


def make_plugin(case: Case):
    from torch.distributed.fsdp import CPUOffload

    from megalith.booster.plugin import TorchFSDPPlugin

    if not case.wrap:
        return TorchFSDPPlugin()

    def per_linear(module, recurse, nonwrapped_numel):
        return recurse or isinstance(module, torch.nn.Linear)

    return TorchFSDPPlugin(auto_wrap_policy=per_linear, cpu_offload=CPUOffload(offload_params=True))


def fresh_seed() -> int:
    import megalith_comm as comm

    seed = torch.tensor([int.from_bytes(os.urandom(3), "little")])
    comm.broadcast(seed, src=0)
    print(f"seed={int(seed)}")
    return int(seed)


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).abs().max()) / max(float(b.abs().max()), 1e-12)


def train_step(model, opt, sched, x, y, backward=None) -> torch.Tensor:
    loss = torch.nn.functional.mse_loss(model(x), y)
    (backward or torch.Tensor.backward)(loss)
    opt.step()
    opt.zero_grad()
    if sched is not None:
        sched.step()
    return loss.detach()


def shard_errors(opt) -> list[str]:
    """Each state tensor is a DTensor placed as its parameter, with its local shape."""
    from torch.distributed.tensor import DTensor

    errors = []
    for g in opt.param_groups:
        for p in g["params"]:
            for k, v in opt.state[p].items():
                if k == "step" or v is None:
                    continue
                if not isinstance(v, DTensor) or v.placements != p.placements:
                    errors.append(f"state {k!r} is {type(v).__name__}, not the param's shard")
                elif v.to_local().shape != p.to_local().shape:
                    errors.append(f"state {k!r} local {v.to_local().shape} vs param's")
    return errors


def state_dict_errors(got: dict, want: dict) -> list[str]:
    errors = []
    if got["param_groups"] != want["param_groups"]:
        errors.append(f"param_groups {got['param_groups']} vs {want['param_groups']}")
    if sorted(got["state"]) != sorted(want["state"]):
        return [*errors, f"state keys {sorted(got['state'])} vs {sorted(want['state'])}"]
    for i, s in want["state"].items():
        if sorted(got["state"][i]) != sorted(s):
            errors.append(f"state {i} keys {sorted(got['state'][i])} vs {sorted(s)}")
            continue
        for k, v in s.items():
            g = got["state"][i][k]
            if k == "step":
                if float(g) != float(v):
                    errors.append(f"state {i} step {g} vs {v}")
            elif torch.is_tensor(v) and not rel(g, v) < 1e-5:
                errors.append(f"state {i} {k!r}: {rel(g, v):.2e} relative")
    return errors


def run(rank: int, case: Case) -> list[str]:
    import megalith_comm as comm
    from megalith.booster import Booster

    torch.set_num_threads(1)
    seed = fresh_seed()
    gen = torch.Generator().manual_seed(seed)
    data = [
        (torch.randn(ROWS, 6, generator=gen), torch.randn(ROWS, 2, generator=gen))
        for _ in range(BEFORE + AFTER)
    ]
    world = comm.get_world()
    n = ROWS // world.world_size
    mine = slice(world.rank * n, (world.rank + 1) * n)

    plain = build(seed)
    plain_opt = make_optimizer(case, plain)
    plain_sched = make_scheduler(case, plain_opt)
    want = [train_step(plain, plain_opt, plain_sched, x, y) for x, y in data]

    model = build(seed)
    opt = make_optimizer(case, model)
    sched = make_scheduler(case, opt)
    for x, y in data[:BEFORE]:  # the user's own steps, before boost()
        train_step(model, opt, sched, x, y)
    booster = Booster(plugin=make_plugin(case))
    if case.optimizer in REFUSED:
        try:
            booster.boost(model, opt, lr_scheduler=sched)
        except ValueError as e:
            ok = REFUSED[case.optimizer] in str(e) and "before its first step" in str(e)
            return [] if ok else [f"refused with {e}"]
        return [f"{case.optimizer}'s states were not refused"]
    model, opt, _, _, sched = booster.boost(model, opt, lr_scheduler=sched)
    errors = shard_errors(opt)
    for i, (x, y) in enumerate(data[BEFORE:]):
        loss = train_step(model, opt, sched, x[mine], y[mine], lambda t: booster.backward(t, opt))
        comm.all_reduce(loss, op="avg")
        if not rel(loss, want[BEFORE + i]) < 1e-5:
            errors.append(f"step {i} after boost: loss {float(loss)} vs {float(want[BEFORE + i])}")
    got = model.state_dict()
    for k, v in plain.state_dict().items():
        if not rel(got[k], v) < 1e-5:
            errors.append(f"{k}: {rel(got[k], v):.2e} relative after {BEFORE + AFTER} steps")
    return errors + state_dict_errors(opt.state_dict(), plain_opt.state_dict())


def run_case(rank: int, case: Case) -> list[str]:
    try:
        return run(rank, case)
    except Exception as e:
        import traceback

        return [f"raised {e!r}\n{traceback.format_exc()}"]


CASES = [
    Case("adam", scheduler="step"),
    Case("adamw", scheduler="lambda"),
    Case("sgd", scheduler="step"),
    Case("adam", wrap=True),
    Case("hybridadam", scheduler="lambda"),
    Case("adafactor"),
    Case("cpuadam-int8"),
]


@pytest.mark.timeout(90)
@pytest.mark.parametrize("world", [2, 3])
def test_fsdp_boost_continues_a_stepped_optimizer(world):
    from megalith.testing import run_grid

    results = run_grid(run_case, CASES, world, timeout=80)
    failures = [
        f"{case} rank {r}: {e}"
        for case, per_rank in zip(CASES, results)
        for r, errs in enumerate(per_rank)
        for e in errs[:3]
    ]
    assert not failures, "\n".join(failures)
