"""booster.enable_lora / save_lora_as_pretrained with ColossalAI's signatures, on CPU
ranks: a transformers GPT-2 with peft LoRA adapters trains under TorchDDPPlugin and
LowLevelZeroPlugin 1 and 2 as plain peft does on one process, only the adapters change,
and the saved directory loads with peft.PeftModel.from_pretrained."""

from __future__ import annotations

import pytest

from megalith.testing import run_grid

pytest.importorskip("peft")
pytest.importorskip("transformers")

PLUGINS = ["ddp", "zero1", "zero2"]


@pytest.mark.timeout(150)
def test_lora_trains_as_peft_and_saves_what_peft_loads(tmp_path):
    from tests.colossalai import lora_workers as w

    settings = [("lora_run", (name, str(tmp_path / name))) for name in PLUGINS]
    results = run_grid(w.mixed, settings, 2, timeout=120)
    for name, per_rank in zip(PLUGINS, results):
        for r in per_rank:
            assert r["same_names"] and r["loaded_names"], (name, r)
            # Adam normalises the first steps' tiny gradients: rounding differences grow
            assert r["loss"] < 1e-5 and r["adapter"] < 2e-4, (name, r)
            assert r["frozen_changed"] == 0.0, (name, r)
            assert r["loaded"] == 0.0, (name, r)  # what peft loads is what was trained
            assert {"adapter_model.safetensors", "adapter_config.json"} <= set(r["files"]), r
