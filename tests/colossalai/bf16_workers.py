"""Rank functions for test_bf16_models.py: models built in bf16 (as ColossalAI's llama
benchmark builds them, torch_dtype=torch.bfloat16) under TorchFSDPPlugin and
HybridParallelPlugin(zero_stage=0), against plain torch in one process."""

from __future__ import annotations

import copy
import math
import warnings

import torch

LR = 1e-2
BETAS = (0.9, 0.999)
EPS = 1e-8
STEPS = 3


def colossal_bf16_adam(p: torch.Tensor, g: torch.Tensor, state: dict, lr: float = LR) -> None:
    """ColossalAI's HybridAdam on a half-precision tensor (its CUDA kernel): the value,
    its gradient and both states read as fp32, AdamW's update in fp32 (no weight
    decay), everything stored back in the tensor's dtype."""
    step = state["step"] = state.get("step", 0) + 1
    m = state.get("m", torch.zeros_like(p)).float()
    v = state.get("v", torch.zeros_like(p)).float()
    g = g.float()
    m = BETAS[0] * m + (1 - BETAS[0]) * g
    v = BETAS[1] * v + (1 - BETAS[1]) * g * g
    denom = (v / (1 - BETAS[1] ** step)).sqrt() + EPS
    new = p.float() - lr * (m / (1 - BETAS[0] ** step)) / denom
    p.copy_(new.to(p.dtype))
    state["m"], state["v"] = m.to(p.dtype), v.to(p.dtype)


def mlp(dtype: torch.dtype, seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    net = torch.nn.Sequential(torch.nn.Linear(12, 24), torch.nn.Tanh(), torch.nn.Linear(24, 6))
    return net.to(dtype)


def fsdp_cases(rank: int, seed: int) -> list[str]:
    """TorchFSDPPlugin + HybridAdam: a bf16 MLP against ColossalAI's bf16 rule on the
    whole batch; an fp32 one under CPUOffload(offload_params=True) (unpinned on these CPU
    ranks) against torch's Adam."""
    import torch.distributed as dist
    from torch.distributed.fsdp.fully_sharded_data_parallel import CPUOffload

    from megalith.booster import Booster
    from megalith.booster.plugin import TorchFSDPPlugin
    from megalith.nn.optimizer import HybridAdam

    errors: list[str] = []
    world = dist.get_world_size()
    g = torch.Generator().manual_seed(seed)
    batches = [torch.randn(2 * world, 12, generator=g) for _ in range(STEPS)]
    cases = [(torch.bfloat16, None), (torch.float32, "offload")]
    for dtype, offload in cases:
        name = f"{dtype} {offload or ''}".strip()
        ref = mlp(dtype, seed)
        model = copy.deepcopy(ref)
        ref_opt = torch.optim.Adam(ref.parameters(), lr=LR, betas=BETAS, eps=EPS)
        ref_state: dict[int, dict] = {}
        opt = HybridAdam(model.parameters(), lr=LR, betas=BETAS, eps=EPS)
        cpu_offload = CPUOffload(offload_params=True) if offload else None
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            booster = Booster(plugin=TorchFSDPPlugin(cpu_offload=cpu_offload))
            model, opt, *_ = booster.boost(model, opt)
        if offload and not any("pin_memory=False" in str(w.message) for w in caught):
            errors.append(f"{name}: no warning about the unpinned offload")
        for x in batches:
            want = ref(x.to(dtype)).float().square().mean()
            want.backward()
            with torch.no_grad():
                if dtype == torch.bfloat16:
                    for i, p in enumerate(ref.parameters()):
                        colossal_bf16_adam(p, p.grad, ref_state.setdefault(i, {}))
                        p.grad = None
                else:
                    ref_opt.step()
                    ref_opt.zero_grad()
            mine = x[rank * 2 : rank * 2 + 2].to(dtype)
            loss = model(mine).float().square().mean()
            booster.backward(loss, opt)
            opt.step()
            opt.zero_grad()
        got = model.state_dict()
        for k, v in ref.state_dict().items():
            if got[k].dtype != dtype:
                errors.append(f"{name} {k}: dtype {got[k].dtype}")
            err = float((got[k].float() - v.float()).abs().max())
            # bf16: the two ranks' gradients are averaged in bf16 (one rounding more than
            # the whole batch's); an update differs by at most one bf16 step of its value
            tol = 2 * 2**-8 * float(v.float().abs().max()) if dtype != torch.float32 else 1e-6
            if err > tol:
                errors.append(f"{name} {k}: max error {err:.3g} > {tol:.3g}")
        states = opt.state_dict()["state"]
        if states[0]["exp_avg"].dtype != dtype:
            errors.append(f"{name}: exp_avg is {states[0]['exp_avg'].dtype}, want {dtype}")
    return errors


def _llama(seed: int) -> torch.nn.Module:
    import transformers as tf

    config = tf.LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=16,
    )  # fmt: skip
    torch.manual_seed(seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return tf.LlamaForCausalLM(config).to(torch.bfloat16).train()


def hybrid_bf16(rank: int, seed: int, tp: int, pp: int) -> list[str]:
    """HybridParallelPlugin(precision="bf16", zero_stage=0) on a bf16 Llama: fp32 masters
    and fp32 states (ColossalAI's HybridParallelAMPOptimizer), the model's parameters
    their bf16 copies; against one process stepping fp32 masters with torch's Adam. A
    small lr: each update is below a bf16 step of most weights, so stepping the bf16
    weights themselves would leave them where they are."""
    from megalith.booster import Booster
    from megalith.booster.plugin import HybridParallelPlugin
    from megalith.nn.optimizer import HybridAdam
    from megalith.tensor_parallel import gather_full

    lr = 2e-5
    errors: list[str] = []
    ref = _llama(seed)
    masters = [p.detach().float().clone().requires_grad_() for p in ref.parameters()]
    ref_opt = torch.optim.Adam(masters, lr=lr, betas=BETAS, eps=EPS)
    model = copy.deepcopy(ref)
    g = torch.Generator().manual_seed(seed)
    batches = [torch.randint(0, 64, (2, 16), generator=g) for _ in range(STEPS)]
    kwargs = dict(num_microbatches=2) if pp > 1 else {}
    plugin = HybridParallelPlugin(tp_size=tp, pp_size=pp, precision="bf16", **kwargs)
    booster = Booster(plugin=plugin)
    opt = HybridAdam(model.parameters(), lr=lr, betas=BETAS, eps=EPS)
    model, opt, *_ = booster.boost(model, opt)
    what = f"tp {tp} pp {pp}"
    for step, ids in enumerate(batches):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            want = ref(input_ids=ids, labels=ids).loss
        want.backward()
        with torch.no_grad():
            for m, p in zip(masters, ref.parameters()):
                m.grad = p.grad.float()
                p.grad = None
            ref_opt.step()
            for m, p in zip(masters, ref.parameters()):
                p.copy_(m)
        batch = {"input_ids": ids, "labels": ids}
        if pp > 1:
            out = booster.execute_pipeline(iter([batch]), model, lambda o, i: o.loss, opt)
            loss = out["loss"]
        else:
            loss = model(**batch).loss
            booster.backward(loss, opt)
        opt.step()
        opt.zero_grad()
        got, want = float(loss.detach()), float(want.detach())
        if not math.isclose(got, want, rel_tol=2e-2):
            errors.append(f"{what} step {step}: loss {got:.5f}, want {want:.5f}")
    ref_params = dict(ref.named_parameters())
    moved = 0
    for name, p in plugin.local_named_parameters(model).items():
        full = gather_full(p, plugin.mesh.group("tp"), getattr(p, "tp_spec", None))
        want = ref_params[name].detach()
        if p.dtype != torch.bfloat16:
            errors.append(f"{what} {name}: the model's parameter is {p.dtype}")
        # the same bf16 values but where the bf16 forward's rounding tipped a master
        # across a rounding boundary
        same = (full.float() == want.float()).float().mean().item()
        if same < 0.9:
            errors.append(f"{what} {name}: {same:.1%} of the values equal the reference's")
        st = opt.optim.state.get(p, {})
        if st and st["exp_avg"].dtype != torch.float32:
            errors.append(f"{what} {name}: exp_avg is {st['exp_avg'].dtype}, want fp32 (masters)")
        start = _llama(seed).state_dict()[name]
        changed = (full.float() != start.float()).float().mean().item()
        moved += changed > 0.05
    if moved == 0:
        errors.append(f"{what}: no parameter moved in {STEPS} steps (no fp32 masters?)")
    return errors


def bf16_grid(rank: int, seed: int) -> list[str]:
    import traceback

    torch.set_num_threads(1)
    errors = []
    for fn, args in ((fsdp_cases, ()), (hybrid_bf16, (2, 1)), (hybrid_bf16, (1, 2))):
        try:
            errors += fn(rank, seed, *args)
        except Exception as exc:  # every case reports, not only the first to fail
            where = " / ".join(traceback.format_exc().strip().splitlines()[-4:])
            errors.append(f"{fn.__name__}{args}: {type(exc).__name__}: {exc} | {where}")
    return errors
