"""Rank functions for test_hybrid_sp_pp.py: HybridParallelPlugin's all-to-all (Ulysses)
sequence parallelism under a pipeline (and GPT-2's beside tp), against the plain model in
one process."""

from __future__ import annotations

import copy
import sys

import torch

from tests.colossalai.hybrid_workers import SEQ, batch, build, close, criterion

STEPS = 3


def _model(name: str) -> torch.nn.Module:
    if name.startswith("megalith."):  # megalith.models' own decoders
        from tests.tensor_parallel.models import ModelCase
        from tests.tensor_parallel.models import build as build_megalith

        return build_megalith(ModelCase("megalith", name.split(".")[1])).train()
    return build(name)


def _batch(name: str, gen: torch.Generator) -> dict[str, torch.Tensor]:
    if name.startswith("megalith."):
        from tests.tensor_parallel.models import VOCAB

        ids = torch.randint(0, VOCAB, (4, SEQ), generator=gen)
        return {"input_ids": ids, "labels": ids}
    return batch(name, gen)


def _ref_loss(name: str, ref: torch.nn.Module, inputs: dict) -> torch.Tensor:
    if name.startswith("megalith."):
        return ref(inputs["input_ids"], labels=inputs["labels"]).loss
    return criterion(ref(**inputs), inputs)


def _layers(model: torch.nn.Module) -> torch.nn.ModuleList:
    if hasattr(model, "blocks"):
        return model.blocks
    trunk = getattr(model, "transformer", None) or getattr(model, "model", model)
    return trunk.h if hasattr(trunk, "h") else trunk.layers


def _record_sequence_lengths(model: torch.nn.Module) -> list[int]:
    """The sequence length each of this rank's decoder layers receives (after the split
    hook of the first, so every entry is a shard's length when the shards travel)."""
    seen: list[int] = []

    def hook(_mod, args, kwargs):
        hidden = args[0] if args else kwargs["hidden_states"]
        seen.append(hidden.shape[1])

    for layer in _layers(model):
        layer.register_forward_pre_hook(hook, with_kwargs=True)
    return seen


def _pieces(inputs: dict[str, torch.Tensor], n: int) -> list[dict[str, torch.Tensor]]:
    return [{k: v.chunk(n)[i] for k, v in inputs.items()} for i in range(n)]


def sp_pp_case(
    seed: int, name: str, tp: int, sp: int, pp: int, zero: int = 0, style: str = "1f1b"
) -> list[str]:
    """STEPS SGD-with-momentum steps on fresh batches: every loss, the first step's
    gradients (tp shards gathered, this rank's stages) and the final parameters equal the
    plain model's; every decoder layer ran on a sequence shard. The batch is cut as the
    plugin cuts it (its dp shares, each into micro-batches) and the plain model steps on
    the mean of the pieces' losses (the pipeline's loss: the micro-batches' mean, which
    differs from the whole batch's token mean when padding differs between pieces)."""
    from megalith.booster import Booster
    from megalith.booster.plugin import HybridParallelPlugin
    from megalith.tensor_parallel import gather_full

    what = f"{name} tp{tp} sp{sp} pp{pp} zero{zero} {style}"
    ref = _model(name)
    model = copy.deepcopy(ref)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
    plugin = HybridParallelPlugin(
        tp_size=tp, pp_size=pp, sp_size=sp, enable_sequence_parallelism=True,
        sequence_parallelism_mode="all_to_all", parallel_output=False, zero_stage=zero,
        **(dict(num_microbatches=2, pp_style=style) if pp > 1 else {}),
        **(dict(num_model_chunks=2) if style == "interleaved" else {}),
    )  # fmt: skip
    booster = Booster(plugin=plugin)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model, opt, *_ = booster.boost(model, opt)
    whole = model.whole if pp > 1 else model.unwrap()
    seen = _record_sequence_lengths(whole)
    errors: list[str] = []
    tp_group = plugin.mesh.group("tp")
    gen = torch.Generator().manual_seed(seed)
    dp_rank, dp = plugin.dp_rank_size
    for step in range(STEPS):
        full = _batch(name, gen)
        micro = 2 if pp > 1 else 1
        losses = torch.stack([_ref_loss(name, ref, x) for x in _pieces(full, dp * micro)])
        losses.mean().backward()
        want = losses[dp_rank * micro : (dp_rank + 1) * micro].mean()
        inputs = _pieces(full, dp)[dp_rank]
        if pp > 1:
            loss = booster.execute_pipeline(iter([inputs]), model, criterion, opt)["loss"]
        else:
            loss = criterion(model(**inputs), inputs)
            booster.backward(loss, opt)
        close(errors, f"{what} step {step} loss", loss, want)
        if step == 0 and not zero:  # ZeRO keeps the gradients in its own buffers
            ref_params = dict(ref.named_parameters())
            for pname, p in plugin.local_named_parameters(model).items():
                if p.grad is None:
                    if ref_params[pname].grad is not None:
                        errors.append(f"{what}: no gradient for {pname}")
                    continue
                full = gather_full(p.grad, tp_group, getattr(p, "tp_spec", None))
                close(errors, f"{what} grad {pname}", full, ref_params[pname].grad)
        ref_opt.step()
        ref_opt.zero_grad()
        opt.step()
        opt.zero_grad()
    ref_params = dict(ref.named_parameters())
    for pname, p in plugin.local_named_parameters(model).items():
        full = gather_full(p.detach(), tp_group, getattr(p, "tp_spec", None))
        close(errors, f"{what} param {pname} after {STEPS} steps", full, ref_params[pname])
    local = {id(p) for p in model.unwrap().parameters()}
    holds_layers = any(id(p) in local for layer in _layers(whole) for p in layer.parameters())
    if set(seen) != ({SEQ // sp} if holds_layers else set()):
        errors.append(f"{what}: decoder layers saw sequence lengths {sorted(set(seen))}")
    return errors


def sp_pp_grid(rank: int, setting: tuple) -> list[str]:
    """setting: (seed, model name, tp, sp, pp[, zero_stage, pp_style])."""
    import traceback

    torch.set_num_threads(1)
    try:
        return sp_pp_case(*setting)
    except Exception as exc:  # every setting reports, not only the first to fail
        where = traceback.format_exc().strip().splitlines()[-4:]
        error = f"{setting}: {type(exc).__name__}: {exc} | {' / '.join(where)}"
        print(f"rank {rank}: {error}", file=sys.stderr, flush=True)
        return [error]
