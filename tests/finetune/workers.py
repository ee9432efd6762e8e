"""Shared by tests/finetune: tiny transformers models, the checkpoints the tests write
with transformers' own save_pretrained, the plugins, and what each rank runs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

VOCAB, SEQ = 64, 8


def config(family: str) -> Any:
    """Tiny configs without dropout; GPT-2's embeddings are tied, Llama's are not (and it
    has grouped-query attention and a rotary inv_freq buffer the files do not hold)."""
    import transformers

    if family == "gpt2":
        return transformers.GPT2Config(
            n_layer=2, n_embd=32, n_head=2, vocab_size=VOCAB, n_positions=16, bos_token_id=0,
            eos_token_id=0, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
        )  # fmt: skip
    if family == "llama":
        return transformers.LlamaConfig(
            vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
            num_attention_heads=2, num_key_value_heads=1, bos_token_id=0, eos_token_id=0,
        )  # fmt: skip
    raise ValueError(family)


def build(family: str) -> torch.nn.Module:
    import transformers

    return transformers.AutoModelForCausalLM.from_config(config(family))


def write_checkpoint(path: Path, family: str, shards: int, dtype: torch.dtype, seed: int) -> None:
    """Random weights saved by transformers' save_pretrained in `shards` files (the
    max_shard_size that gives that many is searched for: how transformers packs tensors
    into files changes between its versions)."""
    import shutil

    torch.manual_seed(seed)
    model = build(family).to(dtype)
    nbytes = sum(p.numel() * p.element_size() for p in model.parameters())
    size = nbytes * 2
    for _ in range(40):
        model.save_pretrained(str(path), max_shard_size=f"{size // 1000 + 1}KB")
        if len(list(path.glob("*.safetensors"))) == shards:
            return
        shutil.rmtree(path)
        size = int(size * 0.85)
    raise AssertionError(f"{family}: no max_shard_size gives {shards} files")


def reference_logits(path: str, ids: torch.Tensor) -> torch.Tensor:
    """transformers' own load of the checkpoint, in fp32."""
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    with torch.no_grad():
        return model.eval()(input_ids=ids).logits


def make_plugin(name: str) -> Any:
    from megalith.booster.plugin import (
        GeminiPlugin,
        HybridParallelPlugin,
        LowLevelZeroPlugin,
        TorchDDPPlugin,
    )

    if name == "ddp":
        return TorchDDPPlugin()
    if name in ("zero1", "zero2"):
        return LowLevelZeroPlugin(stage=int(name[-1]), precision="fp32")
    if name == "zero2-offload":
        return LowLevelZeroPlugin(stage=2, precision="fp32", cpu_offload=True)
    if name == "gemini":
        return GeminiPlugin(precision="fp32")
    if name == "gemini-offload":
        return GeminiPlugin(precision="fp32", offload_optim_frac=1.0, offload_param_frac=1.0)
    if name == "tp2":
        return HybridParallelPlugin(tp_size=2, precision="fp32", parallel_output=False)
    if name == "pp2":
        return HybridParallelPlugin(tp_size=1, pp_size=2, num_microbatches=2, precision="fp32")
    raise ValueError(name)


def ids_for(seed: int) -> torch.Tensor:
    return torch.randint(0, VOCAB, (2, SEQ), generator=torch.Generator().manual_seed(seed))


def streamed_load(rank: int, setting: tuple[str, str, str, int]) -> dict[str, Any]:
    """A model built lazily with other random weights, boosted, then booster.load_model
    from the checkpoint: its logits against transformers' own load; and the same through
    booster.load_model before boost (megalith.pretrained.load_into)."""
    from megalith.booster import Booster
    from megalith.lazy import LazyInitContext

    plugin_name, family, path, seed = setting
    torch.set_num_threads(1)
    ids = ids_for(seed)
    want = reference_logits(path, ids)
    out: dict[str, Any] = {}
    for when in ("after_boost", "before_boost"):
        torch.manual_seed(seed + 1)  # not the checkpoint's weights
        with LazyInitContext():
            model = build(family)
        booster = Booster(plugin=make_plugin(plugin_name))
        if when == "before_boost":
            booster.load_model(model, path)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        model, opt, *_ = booster.boost(model, opt)
        if when == "after_boost":
            booster.load_model(model, path)
        model.eval()
        if plugin_name == "pp2":  # the last stage's logits (forward and backward, no step)
            run = booster.execute_pipeline(
                iter([{"input_ids": ids, "labels": ids}]),
                model,
                lambda outputs, batch: outputs.loss,
                opt,
                return_outputs=True,
            )
            got = run["outputs"].logits if run["outputs"] is not None else want
        else:
            with torch.no_grad():
                got = model(input_ids=ids).logits
        out[when] = float((got.float() - want).abs().max())
        if family == "gpt2" and plugin_name != "pp2":  # stages hold their own copies
            user = model.unwrap()
            out[f"{when}_tied"] = user.lm_head.weight is user.transformer.wte.weight
    return out


def step_mean_loss(booster, opt, loss, backward: bool = True) -> float:
    """Backward (unless the pipeline ran it), step, zero the gradients; the loss averaged
    over every rank."""
    import megalith_comm as comm

    if backward:
        booster.backward(loss, opt)
    opt.step()
    opt.zero_grad()
    mean = loss.detach().clone()
    comm.all_reduce(mean)
    return float(mean) / comm.get_world().world_size
