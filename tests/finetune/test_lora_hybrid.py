"""LoRA under HybridParallelPlugin (issue 19, item 3) on CPU ranks: peft adapters on
transformers' tiny GPT-2 (Conv1D, fused q|k|v, tied embeddings) and Llama (grouped kv
heads: replicated kv rows at tp 2) train under tp 2, pp 2, tp 2 x pp 2 and tp 2 x dp 2
(ZeRO-1) with plain peft's losses on one process (fp32, 1e-5); each adapter is split as
its base layer (tensor_parallel/lora.py); only adapter parameters get optimizer state; the adapter that
save_lora_as_pretrained gathers from every tp shard and pipeline stage loads with
peft.PeftModel.from_pretrained here and equals plain peft's trained adapter."""

from __future__ import annotations

import pytest
import torch

from megalith.testing import run_grid

pytest.importorskip("peft")
pytest.importorskip("transformers")

SEED = 11


def _check(settings, results) -> None:
    import peft

    from tests.finetune import lora_hybrid_workers as w

    for (layout, family, directory, seed), per_rank in zip(settings, results):
        want_losses, want = w.reference(family, seed)
        assert want_losses[-1] < want_losses[0], want_losses
        for r in per_rank:
            assert r["loss"] < 1e-5, (layout, family, r["losses"], want_losses)
            assert r["trainable"] and all("lora_" in n for n in r["trainable"]), r["trainable"]
        keys = per_rank[0]["state_keys"]
        assert keys and all("lora_" in k for k in keys), (layout, family, keys)
        if "tp" in layout:  # each adapter split as its base layer is
            kinds = set(per_rank[0]["kinds"].values())
            assert {"ColumnParallelLinear", "RowParallelLinear"} <= kinds, kinds
            if family == "llama":  # one kv head at tp 2: replicated rows
                assert "HeadRowsLinear" in kinds
        loaded = peft.PeftModel.from_pretrained(w.base_model(family), directory)
        got = peft.get_peft_model_state_dict(loaded)
        assert got.keys() == want.keys(), (layout, family)
        for k in want:
            # Adam normalises the first steps' tiny gradients: summation order shows
            torch.testing.assert_close(
                got[k], want[k], rtol=0, atol=2e-4, msg=f"{layout} {family} {k}"
            )


@pytest.mark.timeout(120)
def test_lora_under_tp2_and_pp2_is_plain_peft(tmp_path):
    from tests.finetune import lora_hybrid_workers as w

    grid = [("tp2", "gpt2"), ("tp2", "llama"), ("pp2", "gpt2"), ("pp2", "llama")]
    settings = [(lay, fam, str(tmp_path / f"{lay}-{fam}"), SEED) for lay, fam in grid]
    _check(settings, run_grid(w.hybrid_lora, settings, 2, timeout=100))


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_lora_under_tp2_x_pp2_and_tp2_x_zero1_dp2_is_plain_peft(tmp_path):
    from tests.finetune import lora_hybrid_workers as w

    grid = [("tp2pp2", "llama"), ("tp2zero1", "gpt2")]
    settings = [(lay, fam, str(tmp_path / f"{lay}-{fam}"), SEED) for lay, fam in grid]
    _check(settings, run_grid(w.hybrid_lora, settings, 4, timeout=180))
