"""GeminiPlugin(tp_size=2) on 4 ranks: tensor parallelism over tp pairs, ZeRO-3 over the
two data-parallel ranks (world 4 is the least that has both axes over 1).

A small transformers Llama trains three steps with clipping (max_norm, so the norm
must span both tp shards) and its losses and parameters equal plain torch's AdamW on
the whole batch; model.state_dict() and save_model give whole (unsharded) tensors, and
load_model of those files into a fresh tp=2 run gives back the same values."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch

from megalith.testing import run_distributed

WORLD, TP = 4, 2
STEPS = 3


def _llama() -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=32,
    )
    return LlamaForCausalLM(config)


def _batches(seed: int) -> list[list[torch.Tensor]]:
    """Per step, one batch of token ids per data-parallel rank."""
    g = torch.Generator().manual_seed(seed)
    dp = WORLD // TP
    return [[torch.randint(0, 64, (2, 12), generator=g) for _ in range(dp)] for _ in range(STEPS)]


def _loss(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    return model(input_ids=ids, labels=ids).loss


def gemini_tp(rank: int, seed: int, directory: str) -> dict[str, float | bool]:
    from megalith.booster import Booster
    from megalith.booster.plugin import GeminiPlugin
    from megalith.tensor import ColoParameter

    torch.manual_seed(seed)
    model = _llama()
    ref = copy.deepcopy(model)
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-2)
    batches = _batches(seed)
    ref_losses = []
    for step in batches:
        loss = torch.stack([_loss(ref, ids) for ids in step]).mean()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(ref.parameters(), 1.0)
        ref_opt.step()
        ref_opt.zero_grad()
        ref_losses.append(loss.item())

    plugin = GeminiPlugin(precision="fp32", tp_size=TP, max_norm=1.0)
    booster = Booster(plugin=plugin)
    model, opt, *_ = booster.boost(model, torch.optim.AdamW(model.parameters(), lr=1e-2))
    dp_rank = rank // TP  # the mesh is (dp, tp), tp fastest
    losses = []
    for step in batches:
        loss = _loss(model, step[dp_rank])
        booster.backward(loss, opt)
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    sharded = any(p.shape != r.shape for p, r in zip(model.unwrap().parameters(), ref.parameters()))
    full = model.state_dict(only_rank_0=False)
    want = ref.state_dict()
    out: dict[str, float | bool] = {
        "sharded": sharded,
        "colo": all(isinstance(p, ColoParameter) for p in model.parameters()),
        # every dp rank's loss against the reference's mean: compare the mean over dp
        "loss": torch.tensor(losses),
        "ref_loss": torch.tensor(ref_losses),
        "shapes": all(full[k].shape == v.shape for k, v in want.items() if k in full),
        "params": max((full[k] - v).abs().max().item() for k, v in want.items() if k in full),
        "grad_norm": opt.get_grad_norm(),
    }
    booster.save_model(model, directory, shard=True)

    torch.manual_seed(seed + 1)  # other initial values: the load must replace them all
    fresh = _llama()
    booster2 = Booster(plugin=GeminiPlugin(precision="fp32", tp_size=TP))
    fresh, *_ = booster2.boost(fresh, torch.optim.AdamW(fresh.parameters(), lr=1e-2))
    booster2.load_model(fresh, directory)
    again = fresh.state_dict(only_rank_0=False)
    out["reloaded"] = max((again[k] - full[k]).abs().max().item() for k in full)
    if rank == 0:
        from safetensors.torch import load_file

        files = {}
        for f in sorted(Path(directory).glob("*.safetensors")):
            files.update(load_file(str(f)))
        out["file_params"] = max((files[k] - v).abs().max().item() for k, v in full.items())
    return out


@pytest.mark.timeout(150)
def test_gemini_tp2_trains_as_torch_and_saves_whole_tensors(tmp_path):
    results = run_distributed(gemini_tp, WORLD, 11, str(tmp_path), timeout=140)
    mean_loss = torch.stack([r["loss"] for r in results]).mean(0)
    for r in results:
        assert r["sharded"] and r["colo"] and r["shapes"], r
        assert torch.allclose(mean_loss, r["ref_loss"], atol=1e-5), (mean_loss, r["ref_loss"])
        assert r["params"] < 1e-5, r
        assert r["reloaded"] == 0.0, r
        assert isinstance(r["grad_norm"], float) and r["grad_norm"] > 1.0, r  # clipped
    assert results[0]["file_params"] == 0.0, results[0]


def test_gemini_tp_sizes_checked_with_the_numbers():
    from megalith.booster.plugin.gemini_tp import check_sizes

    check_sizes(2, 1, 4)
    with pytest.raises(ValueError, match=r"tp_size\(3\) \* extra_dp_size\(1\) = 3 .* 4"):
        check_sizes(3, 1, 4)
