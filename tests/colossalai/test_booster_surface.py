"""Booster's ColossalAI surface, in one process: the constructor's mixed_precision (a
string or a MixedPrecision-like object) and who controls precision, the checkpoint
methods passing every argument by keyword to the plugin's CheckpointIO, and LoRA."""

from __future__ import annotations

import inspect
import warnings
from types import SimpleNamespace

import pytest

from megalith.booster import Booster
from megalith.booster.booster import precision_of
from megalith.booster.plugin import GeminiPlugin, LowLevelZeroPlugin, Plugin, TorchDDPPlugin


def test_signatures_are_colossalai_s():
    def params(fn):
        return list(inspect.signature(fn).parameters)

    assert params(Booster) == ["device", "mixed_precision", "plugin"]
    assert params(Booster.boost)[1:] == [
        "model",
        "optimizer",
        "criterion",
        "dataloader",
        "lr_scheduler",
    ]
    assert params(Booster.save_model)[1:] == [
        "model", "checkpoint", "shard", "gather_dtensor", "prefix", "size_per_shard",
        "use_safetensors", "use_async",
    ]  # fmt: skip
    assert params(Booster.load_model)[1:] == [
        "model",
        "checkpoint",
        "strict",
        "low_cpu_mem_mode",
        "num_threads",
    ]
    assert params(Booster.save_optimizer)[1:] == [
        "optimizer", "checkpoint", "shard", "gather_dtensor", "prefix", "size_per_shard", "use_async",
    ]  # fmt: skip
    assert params(Booster.load_optimizer)[1:] == [
        "optimizer",
        "checkpoint",
        "low_cpu_mem_mode",
        "num_threads",
    ]
    assert params(Booster.enable_lora)[1:] == [
        "model", "pretrained_dir", "lora_config", "bnb_quantization_config", "quantize",
    ]  # fmt: skip
    assert params(Booster.save_lora_as_pretrained)[1:] == ["model", "checkpoint", "use_safetensors"]
    assert inspect.signature(Booster.save_model).parameters["use_safetensors"].default is False


def test_mixed_precision_strings_and_objects():
    assert precision_of(None) == (None, {})
    assert precision_of("bf16") == ("bf16", {})
    fp16 = SimpleNamespace(precision="fp16", initial_scale=2.0**10, growth_factor=3.0,
                           backoff_factor=0.25, growth_interval=7, hysteresis=2)  # fmt: skip
    assert precision_of(fp16) == (
        "fp16",
        {"init_scale": 2.0**10, "growth_factor": 3.0, "backoff_factor": 0.25, "growth_interval": 7},
    )
    with pytest.warns(UserWarning, match="runs as 'fp16'"):
        assert precision_of("fp16_apex")[0] == "fp16"
    for name, fix in [("fp8", "bf16"), ("fp16_naive", "LowLevelZeroPlugin")]:
        with pytest.raises(ValueError, match=fix):
            precision_of(name)
    with pytest.raises(TypeError, match="MixedPrecision"):
        precision_of(object())


def test_who_controls_precision():
    ddp = TorchDDPPlugin()
    Booster(mixed_precision=SimpleNamespace(precision="fp16", initial_scale=64.0), plugin=ddp)
    assert ddp.precision == "fp16" and ddp.grad_scaler_kwargs == {"init_scale": 64.0}
    zero = LowLevelZeroPlugin(precision="bf16")
    with pytest.warns(UserWarning, match="mixed_precision='fp16' is ignored"):
        Booster(mixed_precision="fp16", plugin=zero)
    assert zero.precision == "bf16"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        Booster(mixed_precision="bf16", plugin=LowLevelZeroPlugin(precision="bf16"))
        Booster(plugin=GeminiPlugin())


class _Recorder:
    def __init__(self):
        self.calls = []

    def __getattr__(self, name):
        return lambda *args, **kwargs: self.calls.append((name, args, kwargs))


class _Plugin(Plugin):
    def __init__(self):
        self.io = _Recorder()

    def get_checkpoint_io(self):
        return self.io


def test_checkpoint_methods_pass_everything_by_keyword():
    plugin = _Plugin()
    b = Booster(plugin=plugin)
    b.save_model("m", "ck", True, False, "p.", 7, True, True)
    b.load_model("m", "ck", False, False, 3)
    b.save_optimizer("o", "ck", True, False, "p.", 7, True)
    b.load_optimizer("o", "ck", False, 3)
    assert plugin.io.calls == [
        ("save_model", ("m", "ck"), dict(shard=True, gather_dtensor=False, prefix="p.",
                                         size_per_shard=7, use_safetensors=True, use_async=True)),
        ("load_model", ("m", "ck"), dict(strict=False, low_cpu_mem_mode=False, num_threads=3)),
        ("save_optimizer", ("o", "ck"), dict(shard=True, gather_dtensor=False, prefix="p.",
                                             size_per_shard=7, use_async=True)),
        ("load_optimizer", ("o", "ck"), dict(low_cpu_mem_mode=False, num_threads=3)),
    ]  # fmt: skip


def test_lora():
    import torch

    booster = Booster(plugin=TorchDDPPlugin())
    model = torch.nn.Sequential(torch.nn.Linear(4, 4))
    try:
        import peft
    except ImportError:
        with pytest.raises(ImportError, match="pip install peft"):
            booster.enable_lora(model, lora_config=object())
        return
    lora = booster.enable_lora(model, lora_config=peft.LoraConfig(r=2, target_modules=["0"]))
    assert any("lora_" in n for n, _ in lora.named_parameters())
    assert GeminiPlugin().support_lora()  # tests/finetune/test_lora_plugins.py trains it
