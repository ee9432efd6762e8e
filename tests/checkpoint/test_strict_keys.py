"""Strict loading as torch's: a 4-layer checkpoint into a 3-layer model (unexpected keys)
and a 3-layer one into a 4-layer model (missing keys) fail on every rank, naming the
keys, before any collective, under TorchDDP, LowLevelZero 2 and Gemini (issue 21 item 3);
strict=False loads what is there, except that ZeRO needs every parameter."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import megalith_comm as comm
from megalith.booster import Booster, GeminiPlugin, LowLevelZeroPlugin, TorchDDPPlugin
from megalith.testing import run_grid

PLUGINS = {
    "ddp": lambda: TorchDDPPlugin(),
    "zero2": lambda: LowLevelZeroPlugin(stage=2, precision="fp32"),
    "gemini": lambda: GeminiPlugin(precision="fp32"),
}
CASES = [(p, c) for p in PLUGINS for c in ("extra", "missing")]


def _boosted(plugin: str, layers: int, seed: int):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(*[torch.nn.Linear(6, 6) for _ in range(layers)])
    booster = Booster(plugin=PLUGINS[plugin]())
    model, *_ = booster.boost(model, torch.optim.AdamW(model.parameters(), lr=1e-2))
    return booster, model


def _state(booster, model, path: Path) -> dict[str, torch.Tensor]:
    """The model's full tensors, as its own save writes them (a Gemini model's parameters
    are not readable in place)."""
    from safetensors.torch import load_file

    booster.save_model(model, str(path))
    return load_file(str(path))


def strict_and_lenient(rank: int, setting: tuple[str, str, str]) -> dict:
    plugin, case, root = setting
    path = Path(root) / plugin / case
    saved_layers, model_layers = (4, 3) if case == "extra" else (3, 4)
    booster, saved = _boosted(plugin, saved_layers, seed=1)
    booster.save_model(saved, str(path), shard=True, size_per_shard=0.001)
    booster2, model = _boosted(plugin, model_layers, seed=2)
    out = {}
    for strict in (True, False):
        try:
            booster2.load_model(model, str(path), strict=strict)
            out[strict] = None
        except (KeyError, RuntimeError, ValueError) as e:
            out[strict] = (type(e).__name__, str(e))
        comm.barrier()  # both ranks are here: no rank was left inside a collective
    want = _state(booster, saved, path.with_suffix(".saved.safetensors"))
    got = _state(booster2, model, path.with_suffix(".loaded.safetensors"))
    out["loaded equal"] = all(torch.equal(want[k], got[k]) for k in want.keys() & got.keys())
    return out


@pytest.mark.timeout(90)
def test_strict_load_fails_on_every_rank_naming_the_keys(tmp_path):
    settings = [(p, c, str(tmp_path)) for p, c in CASES]
    results = run_grid(strict_and_lenient, settings, 2, timeout=80)
    for (plugin, case), per_rank in zip(CASES, results):
        for rank, out in enumerate(per_rank):
            where = f"{plugin} {case} rank {rank}: {out}"
            assert out[True] is not None, f"strict load accepted it: {where}"
            kind, text = out[True]
            assert kind == "CheckpointKeyError", where
            if case == "extra":
                assert 'Unexpected key(s) (2): "3.weight", "3.bias"' in text, where
                assert "strict=False" in text, where
                assert out[False] is None, where  # strict=False skips what the model lacks
                assert out["loaded equal"], where
            else:
                assert 'Missing key(s) (2): "3.weight", "3.bias"' in text, where
                if plugin == "ddp":
                    assert out[False] is None and out["loaded equal"], where
                else:  # ZeRO's chunks are whole: every parameter must be there
                    assert out[False] is not None and "ZeRO" in out[False][1], where
