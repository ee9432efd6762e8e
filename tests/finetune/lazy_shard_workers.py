"""What each rank runs in test_lazy_per_shard.py: a model built in LazyInitContext,
boosted under a sharding plugin (materialised a chunk at a time), against the same
model built eagerly under the same seed on one process; and the host memory of such a
boost, from the kernel's peak resident set."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from tests.finetune.workers import build, ids_for, make_plugin, reference_logits


def _status(key: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {key} in /proc/self/status")


def full_values(model: Any) -> dict[str, torch.Tensor]:
    """Every parameter's value of a boosted ZeRO model (gathered at stage 3)."""
    zmodel = model.module
    if zmodel.stage3 is not None:
        return {k: v.float() for k, v in zmodel.full_state_dict().items()}
    return {k: v.detach().float().clone() for k, v in model.unwrap().state_dict().items()}


def plugin_for(name: str) -> Any:
    """workers.make_plugin's, and "gemini-chunks": Gemini with chunks of 2048 elements,
    so a tiny model spans several (one chunk per parameter already under LowLevelZero)."""
    if name == "gemini-chunks":
        from megalith.booster.plugin import GeminiPlugin

        return GeminiPlugin(precision="fp32", chunk_config_dict={"chunk_size": 2048})
    return make_plugin(name)


def run(rank: int, setting: tuple) -> dict[str, Any]:
    """One setting of either kind, so both share one process group."""
    fn = {"equal": lazy_shard_equals_eager, "rss": boost_rss, "load": load_per_shard}[setting[0]]
    return fn(rank, setting[1:])


def lazy_shard_equals_eager(rank: int, setting: tuple[str, str, int]) -> dict[str, Any]:
    """The lazily built, boosted model's parameters and first loss against the eager
    model's, under the same seed (both on every rank; the eager one stays unboosted);
    and whether boost materialised the whole model anywhere (it must not)."""
    from megalith.booster import Booster
    from megalith.lazy import LazyInitContext, context, is_lazy

    plugin_name, family, seed = setting
    torch.set_num_threads(1)
    whole: list[int] = []
    original = context._materialize

    def spy(module: Any, verbose: bool, sliced: bool) -> Any:
        whole.append(sum(p.numel() for p in module.parameters() if p.is_meta))
        return original(module, verbose, sliced)

    context._materialize = spy
    torch.manual_seed(seed)
    eager = build(family)
    torch.manual_seed(seed)
    with LazyInitContext():
        lazy = build(family)
    opt = torch.optim.AdamW(lazy.parameters(), lr=1e-3)
    try:
        model, opt, *_ = Booster(plugin=plugin_for(plugin_name)).boost(lazy, opt)
    finally:
        context._materialize = original
    user = model.unwrap()
    got = full_values(model)
    want = eager.state_dict()
    ids = ids_for(seed)
    with torch.no_grad():
        loss = float(model(input_ids=ids, labels=ids).loss)
        want_loss = float(eager(input_ids=ids, labels=ids).loss)
    out = {
        "unequal": [k for k in want if k in got and not torch.equal(got[k], want[k].float())],
        "missing": [n for n, _ in eager.named_parameters() if n not in got],
        "loss": loss,
        "want_loss": want_loss,
        "lazy_left": is_lazy(user),
        "whole_materialised": whole,
        "chunks": len(model.module.chunks),
    }
    if family == "gpt2":
        out["tied"] = user.lm_head.weight is user.transformer.wte.weight
    return out


def _kept(zmodel: Any) -> int:
    """Bytes this rank keeps after boost: its chunks' buffers (the shard, or the whole
    chunk at stages 1 and 2, the fp32 master where it is not the shard, the gradient
    shard) and the model's buffers."""
    kept = sum(b.numel() * b.element_size() for b in zmodel.module.buffers())
    seen: set[int] = set()
    for c in zmodel.chunks:
        held = [c.shard if zmodel.stage3 is not None else c.full, c.master, c.shard_grad]
        if c.full_grad is not None:
            held.append(c.full_grad)
        for t in held:
            if t is not None and t.untyped_storage().data_ptr() not in seen:
                seen.add(t.untyped_storage().data_ptr())
                kept += t.untyped_storage().nbytes()
    return kept


def boost_rss(rank: int, setting: tuple[str, dict, bool]) -> dict[str, Any]:
    """Peak resident memory that building and boosting a Llama lazily adds on this rank
    (VmHWM reset after the imports), beside the bytes the rank keeps (_kept) and its
    largest chunk in fp32 (as its parameters are materialised). per_chunk=False: the
    path before (LazyInitContext.materialize, the whole model on every rank, then boost)."""
    import transformers

    import megalith.booster.plugin.zero  # noqa: F401  (imports are not the boost's)
    from megalith.booster import Booster
    from megalith.lazy import LazyInitContext

    plugin_name, cfg, per_chunk = setting
    torch.set_num_threads(1)
    config = transformers.LlamaConfig(**cfg)
    # A tiny model boosted first: the process group's, engine's and allocator's first-use
    # memory is not the boost's.
    small = transformers.LlamaConfig(**{**cfg, "num_hidden_layers": 1, "vocab_size": 64})
    tiny = transformers.LlamaForCausalLM(small)
    Booster(plugin=plugin_for(plugin_name)).boost(tiny, torch.optim.AdamW(tiny.parameters()))
    del tiny
    plugin = plugin_for(plugin_name)
    Path("/proc/self/clear_refs").write_text("5")
    before = _status("VmRSS")
    torch.manual_seed(0)
    with LazyInitContext():
        model = transformers.LlamaForCausalLM(config)
    if not per_chunk:
        LazyInitContext.materialize(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    boosted, *_ = Booster(plugin=plugin).boost(model, opt)
    peak = _status("VmHWM")
    zmodel = boosted.module
    return {
        "grew": peak - before,
        "kept": _kept(zmodel),
        "chunk": max(c.spec.numel for c in zmodel.chunks) * 4,
        "chunks": len(zmodel.chunks),
        "params": sum(p.numel() for p in model.parameters()),
    }


def load_per_shard(rank: int, setting: tuple[str, str, str, int]) -> dict[str, Any]:
    """booster.load_model(lazy model, checkpoint) before boost: deferred (the parameters
    stay on the meta device, nothing read whole), then read chunk by chunk at boost; the
    logits against transformers' own load."""
    import megalith.pretrained as load
    from megalith.booster import Booster
    from megalith.lazy import LazyInitContext

    plugin_name, family, path, seed = setting
    torch.set_num_threads(1)
    ids = ids_for(seed)
    want = reference_logits(path, ids)
    torch.manual_seed(seed + 1)  # not the checkpoint's weights
    with LazyInitContext():
        model = build(family)
    whole: list[str] = []
    original = load.load_into

    def spy(module: Any, directory: Any, **kw: Any) -> Any:
        whole.append(str(directory))
        return original(module, directory, **kw)

    load.load_into = spy
    try:
        booster = Booster(plugin=plugin_for(plugin_name))
        booster.load_model(model, path)
        still_meta = all(p.is_meta for p in model.parameters())
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        boosted, opt, *_ = booster.boost(model, opt)
    finally:
        load.load_into = original
    with torch.no_grad():
        got = boosted.eval()(input_ids=ids).logits
    user = boosted.unwrap()
    return {
        "err": float((got.float() - want).abs().max()),
        "deferred": still_meta,
        "whole_reads": whole,
        "chunks": len(boosted.module.chunks),
        "tied": family != "gpt2" or user.lm_head.weight is user.transformer.wte.weight,
    }
