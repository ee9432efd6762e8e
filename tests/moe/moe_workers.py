"""Workers for test_expert_parallel.py: transformers' tiny Mixtral and Qwen3-MoE under
MoeHybridParallelPlugin(ep_size > 1) against the plain model on the whole batch in one
process."""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass

import torch

VOCAB, SEQ, PER_RANK = 96, 8, 2


def tiny(family: str, experts: int, seed: int) -> torch.nn.Module:
    import transformers as tf

    torch.manual_seed(seed)
    common = dict(
        hidden_size=32, intermediate_size=40, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=VOCAB, num_experts_per_tok=2,
        max_position_embeddings=64, tie_word_embeddings=False,
    )  # fmt: skip
    if family == "mixtral":
        config = tf.MixtralConfig(num_local_experts=experts, **common)
        return tf.MixtralForCausalLM(config)
    config = tf.Qwen3MoeConfig(
        num_experts=experts, moe_intermediate_size=24, head_dim=8, norm_topk_prob=True, **common
    )
    return tf.Qwen3MoeForCausalLM(config)


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.detach().double(), b.detach().double()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


@dataclass(frozen=True)
class Case:
    family: str = "mixtral"
    experts: int = 4
    ep: int = 2
    steps: int = 3
    max_norm: float = 0.0
    checkpoint: bool = False  # save after steps-1, reload into a fresh model, one more step
    precision: str = "fp32"  # bf16: autocast, losses within bf16 rounding only
    zero_stage: int = 0  # 1: ZeRO over the dense weights, the experts stepped beside it
    scheduler: bool = False  # a StepLR halving the lr each step, built before boost


def run(rank: int, case: Case) -> list[str]:
    import megalith_comm as comm
    from megalith.booster import Booster
    from megalith.booster.plugin import MoeHybridParallelPlugin

    seed = int.from_bytes(os.urandom(3), "little")
    t = torch.tensor([seed])
    comm.broadcast(t, src=0)
    seed = int(t)
    errors: list[str] = []
    ref = tiny(case.family, case.experts, seed)
    # each rank builds its own weights: boost() must take dp rank 0's (experts included)
    mine = tiny(case.family, case.experts, seed + rank)
    plugin = MoeHybridParallelPlugin(tp_size=1, pp_size=1, ep_size=case.ep,
                                     precision=case.precision, max_norm=case.max_norm,
                                     zero_stage=case.zero_stage)  # fmt: skip
    booster = Booster(plugin=plugin)

    def sgd(params):
        return torch.optim.SGD(params, lr=0.2, momentum=0.9)

    def halving(optimizer):
        return torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)

    raw = sgd(mine.parameters())
    sched = halving(raw) if case.scheduler else None
    model, opt, _, _, sched = booster.boost(mine, raw, lr_scheduler=sched)
    opt_ref = sgd(ref.parameters())
    sched_ref = halving(opt_ref) if case.scheduler else None
    dp_rank, dp = plugin.dp_rank_size
    gen = torch.Generator().manual_seed(seed)
    batches = [
        torch.randint(0, VOCAB, (PER_RANK * dp, SEQ), generator=gen) for _ in range(case.steps)
    ]
    for step, ids in enumerate(batches):
        if case.checkpoint and step == case.steps - 1:
            model, opt = _reload(booster, ref, case, model, opt, sgd, errors)
            sched = None  # the files hold the scheduled lr; the last step needs no more
        want = ref(ids, labels=ids).loss
        want.backward()
        local = ids.chunk(dp)[dp_rank]
        loss = model(local, labels=local).loss
        booster.backward(loss, opt)
        got = loss.detach().reshape(1)
        comm.all_reduce(got, op="avg", group=plugin.mesh.group("dp"))
        if rel(got[0], want) > (1e-5 if case.precision == "fp32" else 2e-2):
            errors.append(f"step {step}: loss {float(got[0])} against {float(want)}")
        if step == 0 and case.precision == "fp32" and not case.zero_stage:
            _check_grads(model, ref, errors)  # under ZeRO the dense gradients are its shards
        if case.max_norm:  # the boosted optimizer clips by the whole model's norm in step()
            torch.nn.utils.clip_grad_norm_(ref.parameters(), case.max_norm)
        opt.step()
        opt.zero_grad()
        opt_ref.step()
        opt_ref.zero_grad()
        if sched is not None:
            sched.step()
        if sched_ref is not None:
            sched_ref.step()
    if case.precision == "fp32":
        _check_weights(model, ref, errors, "trained")
    return errors


def _full(name: str, p: torch.Tensor, grad: bool = False) -> torch.Tensor:
    from megalith.tensor_parallel.state import gather_full

    t = p.grad if grad else p
    if hasattr(p, "ep_spec"):
        return gather_full(t, p.ep_group, p.ep_spec)
    return t.detach()


def _check_grads(model, ref, errors: list[str]) -> None:
    want = dict(ref.named_parameters())
    for name, p in model.unwrap().named_parameters():
        err = rel(_full(name, p, grad=True), want[name].grad)
        if err > 1e-5:
            errors.append(f"first gradient of {name}: relative error {err:.3g}")


def _check_weights(model, ref, errors: list[str], what: str) -> None:
    want = dict(ref.named_parameters())
    for name, p in model.unwrap().named_parameters():
        full = _full(name, p)
        if full.shape != want[name].shape:
            errors.append(f"{what} {name}: shape {tuple(full.shape)}")
        elif rel(full, want[name]) > 1e-5:
            errors.append(f"{what} {name}: relative error {rel(full, want[name]):.3g}")


def _reload(booster, ref, case: Case, model, opt, sgd, errors: list[str]):
    """Saves model and optimizer; transformers reads the files as the trained model; a
    fresh model boosted from another seed loads both and goes on."""
    import shutil

    import megalith_comm as comm
    from megalith.booster import Booster
    from megalith.booster.plugin import MoeHybridParallelPlugin

    path = os.path.join(tempfile.gettempdir(), f"megalith-moe-ckpt-{os.getppid()}-{case.ep}")
    booster.save_model(model, os.path.join(path, "model"), shard=True, size_per_shard=1)
    booster.save_optimizer(opt, os.path.join(path, "optim"), shard=True)
    before = {n: _full(n, p) for n, p in model.unwrap().named_parameters()}
    hf = type(ref).from_pretrained(os.path.join(path, "model"))
    ids = torch.randint(0, VOCAB, (2, SEQ))
    with torch.no_grad():
        err = rel(hf(ids).logits, ref(ids).logits)
    if err > 1e-5:
        errors.append(f"transformers' from_pretrained of the files: logits off by {err:.3g}")
    fresh = tiny(case.family, case.experts, 12345)
    plugin = MoeHybridParallelPlugin(tp_size=1, pp_size=1, ep_size=case.ep, precision="fp32",
                                     max_norm=case.max_norm, zero_stage=case.zero_stage)  # fmt: skip
    other = Booster(plugin=plugin)
    model2, opt2, *_ = other.boost(fresh, sgd(fresh.parameters()))
    other.load_model(model2, os.path.join(path, "model"))
    other.load_optimizer(opt2, os.path.join(path, "optim"))
    _check_same_states(opt.state_dict(), opt2.state_dict(), errors)
    _check_same_weights(model2, before, errors, "reloaded")
    with torch.no_grad():
        for p in model2.unwrap().parameters():
            p.add_(1.0)  # what load_state_dict must overwrite
    model2.load_state_dict(model.state_dict())  # experts as this rank holds them
    _check_same_weights(model2, before, errors, "model.load_state_dict")
    comm.barrier()
    if comm.get_world().rank == 0:
        shutil.rmtree(path, ignore_errors=True)
    return model2, opt2


def _check_same_weights(model, want: dict[str, torch.Tensor], errors: list[str], what: str) -> None:
    for name, p in model.unwrap().named_parameters():
        if not torch.equal(_full(name, p), want[name]):
            errors.append(f"{what} {name} differs from the saved model")


def _check_same_states(a: dict, b: dict, errors: list[str], where: str = "state") -> None:
    """The optimizer states (not the param groups) of two state dicts, tensor by tensor."""
    for key in ("state", "expert_state"):
        if key not in a:
            continue
        if key == "expert_state":
            _check_same_states(a[key], b[key], errors, key)
            continue
        if a[key].keys() != b[key].keys():
            errors.append(f"optimizer {where}: parameters {sorted(a[key])} vs {sorted(b[key])}")
            continue
        for i, entry in a[key].items():
            for k, v in entry.items():
                other = b[key][i].get(k)
                same = (
                    torch.equal(torch.as_tensor(v), torch.as_tensor(other))
                    if other is not None
                    else False
                )
                if not same:
                    errors.append(f"optimizer {where}: {i}/{k} differs after reloading")


@dataclass(frozen=True)
class Resume:
    precision: str = "fp32"
    optimizer: str = "adamw"  # "hybrid": megalith's HybridAdam, ColossalAI's examples' choice


def resume_equal(rank: int, case: Resume) -> list[str]:
    """zero_stage=1 under Adam: two steps, save, load into a fresh boosted model; the
    states, the scheduled lr and one more step of both runs are bit-equal (Adam's
    updates of near-zero gradients are compared run to run, never against torch)."""
    import shutil

    import megalith_comm as comm
    from megalith.booster import Booster
    from megalith.booster.plugin import MoeHybridParallelPlugin
    from megalith.nn.optimizer import HybridAdam

    errors: list[str] = []

    def boost(seed: int):
        model = tiny("mixtral", 4, seed)
        plugin = MoeHybridParallelPlugin(tp_size=1, pp_size=1, ep_size=2, zero_stage=1,
                                         precision=case.precision, max_norm=1.0)  # fmt: skip
        booster = Booster(plugin=plugin)
        cls = HybridAdam if case.optimizer == "hybrid" else torch.optim.AdamW
        raw = cls(model.parameters(), lr=1e-3, weight_decay=0.01)
        sched = torch.optim.lr_scheduler.StepLR(raw, step_size=1, gamma=0.5)
        model, opt, _, _, sched = booster.boost(model, raw, lr_scheduler=sched)
        return booster, model, opt, sched

    def step(booster, model, opt, ids) -> float:
        loss = model(ids, labels=ids).loss
        booster.backward(loss, opt)
        opt.step()
        opt.zero_grad()
        return float(loss.detach())

    booster, model, opt, sched = boost(int.from_bytes(os.urandom(3), "little"))
    ids = torch.randint(0, VOCAB, (PER_RANK, SEQ))
    for _ in range(2):
        step(booster, model, opt, ids)
        sched.step()
    path = os.path.join(tempfile.gettempdir(), f"megalith-moe-resume-{os.getppid()}")
    booster.save_model(model, os.path.join(path, "model"), shard=True)
    booster.save_optimizer(opt, os.path.join(path, "optim"), shard=True)
    booster2, model2, opt2, _ = boost(12345)
    booster2.load_model(model2, os.path.join(path, "model"))
    booster2.load_optimizer(opt2, os.path.join(path, "optim"))
    _check_same_states(opt.state_dict(), opt2.state_dict(), errors)
    if not opt.state_dict()["expert_state"]["state"]:
        errors.append("the experts' optimizer holds no states after two steps")
    if opt2.param_groups[0]["lr"] != opt.param_groups[0]["lr"]:
        errors.append(
            f"lr {opt2.param_groups[0]['lr']} after loading, {opt.param_groups[0]['lr']} saved"
        )
    if step(booster, model, opt, ids) != step(booster2, model2, opt2, ids):
        errors.append("the loss of the step after loading differs from the saved run's")
    want = dict(model.unwrap().named_parameters())
    for name, p in model2.unwrap().named_parameters():
        if not torch.equal(p, want[name]):
            errors.append(f"{name} differs one step after loading")
    comm.barrier()
    if comm.get_world().rank == 0:
        shutil.rmtree(path, ignore_errors=True)
    return errors
