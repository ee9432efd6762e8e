"""What each rank runs in tests/colossalai/test_checkpoint_surface.py and test_lazy_init.py
(module-level functions: run_distributed spawns them)."""

from __future__ import annotations

import warnings
from pathlib import Path

import torch

from megalith.booster import (
    Booster,
    GeminiPlugin,
    HybridParallelPlugin,
    LowLevelZeroPlugin,
    TorchDDPPlugin,
)

PLUGINS = {
    "ddp": lambda: TorchDDPPlugin(),
    "zero2": lambda: LowLevelZeroPlugin(stage=2, precision="fp32"),
    "gemini": lambda: GeminiPlugin(precision="fp32"),
    "hybrid": lambda: HybridParallelPlugin(tp_size=1, pp_size=1, precision="fp32"),
}


def bn_net(seed: int) -> torch.nn.Module:
    """A small CNN with BatchNorm: its running stats are persistent buffers."""
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 4, 3),
        torch.nn.BatchNorm2d(4),
        torch.nn.ReLU(),
        torch.nn.Flatten(),
        torch.nn.Linear(4 * 6 * 6, 5),
    )


def _boost(name: str, model: torch.nn.Module):
    booster = Booster(plugin=PLUGINS[name]())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)  # torch's defaults otherwise
    model, opt, *_ = booster.boost(model, opt)
    return booster, model, opt


def _state(model) -> dict[str, torch.Tensor]:
    return {k: v.detach().float().cpu().clone() for k, v in model.unwrap().state_dict().items()}


def _buffers(model) -> dict[str, torch.Tensor]:
    return {k: v.detach().float().cpu().clone() for k, v in model.unwrap().named_buffers()}


def _file(path: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return {k: v.float() for k, v in load_file(str(path)).items()}


def buffers_kept(rank: int, root: str, seed: int) -> list[str]:
    """Under every plugin: a step moves BatchNorm's running stats; single-file and sharded
    saves (use_async too) hold them with the parameters, and a differently seeded model
    takes them back: its own save is the same tensors. (Gemini's unwrapped parameters
    are freed outside forward, so the files stand in for them there.)"""
    errors: list[str] = []
    path = Path(root)
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(4, 3, 8, 8, generator=gen)
    for name in PLUGINS:
        booster, model, opt = _boost(name, bn_net(seed))
        model.train()
        booster.backward(model(x).square().mean(), opt)  # one batch: the same stats on every rank
        opt.step()
        live = _buffers(model) if name == "gemini" else _state(model)
        if torch.equal(live["1.running_mean"], torch.zeros(4)):
            errors.append(f"{name}: running_mean did not move: test is moot")
        single, sharded = path / f"{name}.safetensors", path / f"{name}-dir"
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # ZeRO writes use_async saves synchronously
            booster.save_model(model, str(single), use_async=True)
        booster.save_model(model, str(sharded), shard=True, size_per_shard=0.001)
        booster.checkpoint_io.synchronize()
        saved = _file(single)
        for k, v in live.items():
            if k not in saved:
                errors.append(f"{name}: the single file lacks {k}")
            elif not torch.equal(saved[k], v):
                errors.append(f"{name}: the single file's {k} is not the model's")
        for source in (single, sharded):
            b2, m2, _ = _boost(name, bn_net(seed + 1))
            b2.load_model(m2, str(source))
            again = path / f"{name}-again.safetensors"
            b2.save_model(m2, str(again))
            got = _file(again)
            for k, v in saved.items():
                if not torch.equal(got[k], v):
                    errors.append(f"{name} {source.name}: {k} differs after the load")
    return errors


def llama_config_under_zero(rank: int, root: str) -> list[str]:
    """LowLevelZeroPlugin's sharded save of a tiny Llama: from_pretrained on the directory
    builds the same architecture with the same weights."""
    from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(3)
    config = LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        tie_word_embeddings=False,
    )
    booster = Booster(plugin=LowLevelZeroPlugin(stage=2, precision="fp32"))
    model = LlamaForCausalLM(config)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model, opt, *_ = booster.boost(model, opt)
    ids = torch.randint(0, 64, (2, 8))
    booster.backward(model(input_ids=ids, labels=ids).loss, opt)
    opt.step()
    want = _state(model)
    directory = Path(root) / "llama"
    booster.save_model(model, str(directory), shard=True, size_per_shard=0.01)
    errors: list[str] = []
    if rank == 0:
        loaded = AutoModelForCausalLM.from_pretrained(str(directory))
        if type(loaded) is not LlamaForCausalLM or loaded.config.hidden_size != 32:
            errors.append(f"from_pretrained built {type(loaded).__name__} {loaded.config}")
        got = loaded.state_dict()
        for k, v in want.items():
            if not torch.equal(got[k].float(), v):
                errors.append(f"llama {k} differs after from_pretrained")
    return errors


def plugin_checks(rank: int, root: str, seed: int) -> list[str]:
    """Both checks above in one process group (one spawn)."""
    return buffers_kept(rank, root, seed) + llama_config_under_zero(rank, root)


def tiny_models() -> dict:
    """Builders of tiny transformers models (no dropout, so runs compare exactly)."""
    from transformers import (
        BertConfig,
        BertForMaskedLM,
        GPT2Config,
        GPT2LMHeadModel,
        LlamaConfig,
        LlamaForCausalLM,
    )

    gpt2 = GPT2Config(
        n_layer=2, n_embd=32, n_head=2, vocab_size=64, n_positions=16, bos_token_id=0,
        eos_token_id=0, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
    )  # fmt: skip
    llama = LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1,
    )  # fmt: skip
    bert = BertConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=2, max_position_embeddings=32, hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )  # fmt: skip
    return {
        "gpt2": lambda: GPT2LMHeadModel(gpt2),
        "llama": lambda: LlamaForCausalLM(llama),
        "bert": lambda: BertForMaskedLM(bert),
    }


def lazy_boost_matches_eager(rank: int, seed: int) -> list[str]:
    """A GPT-2 built in LazyInitContext and materialised, boosted (TorchDDP, LowLevelZero
    stage 2) on 2 ranks, each with its half of the batch: two steps equal a plain
    single-process AdamW on the whole batch."""
    import megalith_comm as comm
    from megalith.lazy import LazyInitContext, is_lazy

    torch.set_num_threads(1)
    build = tiny_models()["gpt2"]
    gen = torch.Generator().manual_seed(seed)
    batches = [torch.randint(0, 64, (4, 8), generator=gen) for _ in range(2)]
    torch.manual_seed(seed)
    ref = build()
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-2)
    for ids in batches:
        ref(input_ids=ids, labels=ids).loss.backward()
        ref_opt.step()
        ref_opt.zero_grad()
    want = {n: p.detach().clone() for n, p in ref.named_parameters()}
    errors: list[str] = []
    for name in ("ddp", "zero2"):
        runs = {}
        for lazy in (False, True):
            torch.manual_seed(seed)
            if lazy:
                with LazyInitContext():
                    model = build()
                if not is_lazy(model):
                    errors.append(f"{name}: not lazy")
                LazyInitContext.materialize(model)  # the line boost will run itself
            else:
                model = build()
            booster, model, opt = _boost(name, model)
            for ids in batches:
                mine = ids[2 * rank : 2 * rank + 2]
                booster.backward(model(input_ids=mine, labels=mine).loss, opt)
                opt.step()
                opt.zero_grad()
            runs[lazy] = {
                n: p.detach().float().clone() for n, p in model.unwrap().named_parameters()
            }
            comm.barrier()
        for n, p in runs[True].items():
            if not torch.equal(p, runs[False][n]):
                errors.append(f"{name} {n}: the lazy run differs from the eager one")
            # AdamW divides by sqrt(v): a near-zero gradient (c_attn's key bias) turns
            # summation-order noise into ~lr * 1e-3
            if not torch.allclose(p, want[n], rtol=1e-4, atol=1e-4):
                diff = (p - want[n]).abs().max().item()
                errors.append(f"{name} {n}: differs from the single process by {diff:.2e}")
    return errors
