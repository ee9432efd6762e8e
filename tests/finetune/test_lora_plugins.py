"""LoRA under the sharded plugins (issue 19, item 3), on 2 CPU ranks: a transformers
GPT-2 with peft adapters trains under LowLevelZero 1 and 2 and Gemini (with and without
offload) with plain peft's losses on one process; only adapter parameters get optimizer
state; the frozen base weights do not move; the saved adapter loads with
peft.PeftModel.from_pretrained in this process (not the ranks') and equals plain peft's
trained adapter. (TorchDDP and LowLevelZero against peft's in-process model:
tests/colossalai/test_lora.py.)"""

from __future__ import annotations

import pytest
import torch

from megalith.testing import run_grid

pytest.importorskip("peft")
pytest.importorskip("transformers")

PLUGINS = ["zero1", "zero2", "gemini", "gemini-offload"]


@pytest.mark.timeout(200)
def test_lora_under_the_sharded_plugins_is_plain_peft(tmp_path):
    import peft

    from tests.colossalai.lora_workers import base_model
    from tests.finetune import lora_workers as w

    settings = [(name, str(tmp_path / name)) for name in PLUGINS]
    results = run_grid(w.lora_plugin_run, settings, 2, timeout=180)
    want_losses, want = w.reference()
    assert want_losses[-1] < want_losses[0]
    for (name, directory), per_rank in zip(settings, results):
        for r in per_rank:
            assert r["loss"] < 1e-5, (name, r["losses"], want_losses)
            assert r["state_keys"] and all("lora_" in k for k in r["state_keys"]), (name, r)
        assert per_rank[0]["frozen_changed"] == 0.0, (name, per_rank[0])
        loaded = peft.PeftModel.from_pretrained(base_model(), directory)
        got = peft.get_peft_model_state_dict(loaded)
        assert got.keys() == want.keys(), name
        for k in want:
            # Adam normalises the first steps' tiny gradients: summation order shows
            torch.testing.assert_close(got[k], want[k], rtol=0, atol=2e-4, msg=f"{name} {k}")
