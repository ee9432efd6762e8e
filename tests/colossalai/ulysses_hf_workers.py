"""Rank functions for test_ulysses_hf.py: HybridParallelPlugin's all-to-all sequence
parallelism on transformers' LlamaForCausalLM, against the plain model in one process."""

from __future__ import annotations

import copy
import warnings

import torch

VOCAB, SEQ, BATCH, STEPS, LR = 64, 8, 2, 2, 0.5


def llama(kv_heads: int = 2, family: str = "Llama") -> torch.nn.Module:
    """A tiny transformers decoder of the Llama family: Llama, Mistral (a sliding window
    shorter than the sequence), Qwen2 (q/k/v biases; its second layer slides) or Qwen3
    (per-head q/k norms)."""
    import transformers as tf

    extra = {
        "Mistral": {"sliding_window": SEQ // 2},
        "Qwen2": {
            "use_sliding_window": True, "sliding_window": SEQ // 2, "max_window_layers": 1,
        },
        "Qwen3": {"head_dim": 8},
    }.get(family, {})  # fmt: skip
    config = getattr(tf, f"{family}Config")(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=kv_heads, max_position_embeddings=SEQ,
        **extra,
    )  # fmt: skip
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return getattr(tf, f"{family}ForCausalLM")(config).train()


def ulysses_case(
    rank: int, sp: int, tp: int, masked: bool, seed: int, family: str = "Llama"
) -> list[str]:
    """STEPS SGD steps under sp x tp (every rank of an sp group the same batch): each
    loss and, after them, every parameter (tp shards gathered) equal the plain model's."""
    from megalith.booster import Booster
    from megalith.booster.plugin import HybridParallelPlugin
    from megalith.tensor_parallel import gather_full

    errors: list[str] = []
    ref = llama(family=family)
    model = copy.deepcopy(ref)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=LR)
    plugin = HybridParallelPlugin(
        tp_size=tp, sp_size=sp, enable_sequence_parallelism=True,
        sequence_parallelism_mode="all_to_all", parallel_output=False,
    )  # fmt: skip
    booster = Booster(plugin=plugin)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    model, opt, *_ = booster.boost(model, opt)
    g = torch.Generator().manual_seed(seed)
    what = f"{family} sp {sp} tp {tp}{' masked' if masked else ''}"
    for step in range(STEPS):
        ids = torch.randint(1, VOCAB, (BATCH, SEQ), generator=g)
        batch = {"input_ids": ids, "labels": ids}
        if masked:  # left padding in the second row: the 4-D mask path
            batch["attention_mask"] = torch.ones_like(ids)
            batch["attention_mask"][1, :3] = 0
        want = ref(**batch).loss
        want.backward()
        ref_opt.step()
        ref_opt.zero_grad()
        loss = model(**batch).loss
        booster.backward(loss, opt)
        opt.step()
        opt.zero_grad()
        got, want = float(loss.detach()), float(want.detach())
        if abs(got - want) > 1e-5 * abs(want):
            errors.append(f"{what} step {step}: loss {got:.6f}, want {want:.6f}")
    ref_params = dict(ref.named_parameters())
    for name, p in plugin.local_named_parameters(model).items():
        full = gather_full(p, plugin.mesh.group("tp"), getattr(p, "tp_spec", None))
        want = ref_params[name].detach()
        err = float((full - want).abs().max())
        if err > 1e-5 * float(want.abs().max()) + 1e-6:
            errors.append(f"{what} {name}: max error {err:.3g}")
    return errors


def ulysses_grid(rank: int, settings: list[tuple], seed: int) -> list[str]:
    """settings: (sp, tp, masked) or (sp, tp, masked, family)."""
    import traceback

    torch.set_num_threads(1)
    errors = []
    for sp, tp, masked, *family in settings:
        try:
            errors += ulysses_case(rank, sp, tp, masked, seed, *family)
        except Exception as exc:  # every setting reports, not only the first to fail
            where = " / ".join(traceback.format_exc().strip().splitlines()[-4:])
            errors.append(f"{family} sp {sp} tp {tp}: {type(exc).__name__}: {exc} | {where}")
    return errors
