"""What each rank runs in test_lora_sp.py: peft LoRA adapters on transformers' tiny
Llama and GPT-2 under HybridParallelPlugin with sequence parallelism (Ulysses'
all_to_all over an sp axis, beside tp or pp, Megatron's split_gather over the tp group) against plain
peft on one process with the same adapter values (copied in before boost): the first
step's loss and every adapter gradient (this rank's shard of the reference's), the
losses of a few optimizer steps, frozen base weights that did not move, the adapter
saved with save_lora_as_pretrained, and this rank's logits after training (none under
pp)."""

from __future__ import annotations

from typing import Any

import torch

from tests.finetune import lora_hybrid_workers
from tests.finetune.workers import SEQ, VOCAB, config

STEPS, BATCH, LR = 3, 4, 0.2


def base_model(family: str) -> torch.nn.Module:
    """lora_hybrid_workers' tiny models, and "llama4": its Llama with 4 query and 2 kv
    heads (tp 2 x sp 2 Ulysses needs heads divisible by 4)."""
    if family != "llama4":
        return lora_hybrid_workers.base_model(family)
    import transformers

    cfg = config("llama")
    cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim = 4, 2, 8
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(cfg)


def lora_config(family: str) -> Any:
    return lora_hybrid_workers.lora_config("llama" if family == "llama4" else family)


def batch(seed: int) -> torch.Tensor:
    return torch.randint(0, VOCAB, (BATCH, SEQ), generator=torch.Generator().manual_seed(seed))


def plain_peft(family: str, seed: int) -> Any:
    """The reference: plain peft with adapters drawn from `seed`."""
    import peft

    torch.manual_seed(seed)
    return peft.get_peft_model(base_model(family), lora_config(family))


def train(loss_of, backward, step, named: torch.nn.Module) -> tuple[list[float], dict]:
    """STEPS steps on one batch (loss_of() runs the forward); the adapters' gradients of
    the first (named's names, of the parameters this rank holds)."""
    losses, first = [], {}
    for i in range(STEPS):
        loss = loss_of()
        backward(loss)
        if i == 0:
            first = {
                n: p.grad.detach().clone()
                for n, p in named.named_parameters()
                if p.grad is not None and not p.is_meta
            }
        step()
        losses.append(float(loss.detach()))
    return losses, first


def reference(family: str, seed: int) -> dict[str, Any]:
    """Plain peft's losses, first gradients, trained adapter (peft's names) and logits."""
    import peft

    model = plain_peft(family, seed)
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=LR)

    def step() -> None:
        opt.step()
        opt.zero_grad()

    ids = batch(seed)

    def loss_of() -> torch.Tensor:
        return model(input_ids=ids, labels=ids).loss

    losses, grads = train(loss_of, lambda loss: loss.backward(), step, model)
    with torch.no_grad():
        logits = model(input_ids=ids).logits
    adapter = {k: v.detach().clone() for k, v in peft.get_peft_model_state_dict(model).items()}
    return {"losses": losses, "grads": grads, "adapter": adapter, "logits": logits}


def plugin(layout: str) -> Any:
    from megalith.booster.plugin import HybridParallelPlugin

    if layout == "sp2_all_to_all":
        return HybridParallelPlugin(
            tp_size=1, sp_size=2, enable_sequence_parallelism=True,
            sequence_parallelism_mode="all_to_all", precision="fp32",
        )  # fmt: skip
    if layout == "tp2_sp2_all_to_all":
        return HybridParallelPlugin(
            tp_size=2, sp_size=2, enable_sequence_parallelism=True,
            sequence_parallelism_mode="all_to_all", precision="fp32",
        )  # fmt: skip
    if layout == "sp2_pp2_all_to_all":
        return HybridParallelPlugin(
            tp_size=1, sp_size=2, pp_size=2, num_microbatches=2,
            enable_sequence_parallelism=True, sequence_parallelism_mode="all_to_all",
            precision="fp32",
        )  # fmt: skip
    if layout == "tp2_split_gather":
        return HybridParallelPlugin(
            tp_size=2, enable_sequence_parallelism=True,
            sequence_parallelism_mode="split_gather", precision="fp32",
        )  # fmt: skip
    raise ValueError(layout)


def _relative(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got - want).abs().max() / want.abs().max().clamp_min(1e-30))


def _local(want: torch.Tensor, p: torch.nn.Parameter, tp: Any) -> torch.Tensor:
    """This rank's shard of a full reference tensor, as p is cut (whole if p is not)."""
    spec = getattr(p, "tp_spec", None)
    return want if spec is None or tp is None else spec.take(want, tp.rank, tp.size)


def _vocab_shard(full: torch.Tensor, got: torch.Tensor, tp: Any) -> torch.Tensor:
    """The reference logits as this rank holds them (vocabulary-parallel under tp)."""
    if got.shape[-1] == full.shape[-1]:
        return full
    return full.chunk(tp.size, dim=-1)[tp.rank]


def sp_lora(rank: int, setting: tuple[str, str, str, int]) -> dict[str, Any]:
    import peft

    from megalith.booster import Booster

    layout, family, directory, seed = setting
    torch.set_num_threads(1)
    want = reference(family, seed)
    booster = Booster(plugin=plugin(layout))
    model = booster.enable_lora(base_model(family), lora_config=lora_config(family))
    peft.set_peft_model_state_dict(model, peft.get_peft_model_state_dict(plain_peft(family, seed)))
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    peft_model = model  # its parameters are the boosted ones (sharded, or this stage's)
    model, opt, *_ = booster.boost(model, opt)
    real = [(n, p) for n, p in peft_model.named_parameters() if not p.is_meta]  # this stage's
    frozen = {n: p.detach().clone() for n, p in real if not p.requires_grad}

    def step() -> None:
        opt.step()
        opt.zero_grad()

    ids = batch(seed)
    pipelined = "pp" in layout

    def loss_of() -> torch.Tensor:
        if pipelined:  # forward and backward
            data = iter([{"input_ids": ids, "labels": ids}])
            return booster.execute_pipeline(data, model, lambda out, _: out.loss, opt)["loss"]
        return model(input_ids=ids, labels=ids).loss

    def backward(loss: torch.Tensor) -> None:
        if not pipelined:
            booster.backward(loss, opt)

    losses, grads = train(loss_of, backward, step, peft_model)
    tp = getattr(peft_model.get_base_model(), "tp_info", None)
    tp = tp.group if tp is not None else None
    params = dict(real)
    grad_error = {
        n: _relative(g, _local(want["grads"][n], params[n], tp)) for n, g in grads.items()
    }
    moved = max((float((p - frozen[n]).abs().max()) for n, p in real if n in frozen), default=0.0)
    logits, logits_error = None, None
    if not pipelined:
        model.eval()
        with torch.no_grad():
            logits = model(input_ids=ids).logits
        logits_error = _relative(logits, _vocab_shard(want["logits"], logits, tp))
    booster.save_lora_as_pretrained(model, directory)
    return {
        "loss": max(abs(a - b) / abs(b) for a, b in zip(losses, want["losses"])),
        "losses": losses,
        "want": want["losses"],
        "grad_names": sorted(grads),
        "want_grad_names": sorted(want["grads"]),
        "grad_error": grad_error,
        "frozen_moved": moved,
        "n_frozen": len(frozen),
        "trainable": sorted(n for n, p in real if p.requires_grad),
        "logits_error": logits_error,
        "logits": logits,
    }
