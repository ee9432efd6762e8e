"""ColossalAI's checkpoint I/O surface: `megalith.checkpoint_io` used on its own (as
ColossalAI's tests/test_checkpoint_io use GeneralCheckpointIO: a plain module and torch
optimizer, no Booster, no process group), every argument of its methods, the file-name
prefix, CheckpointIndexFile, use_async, config.json for transformers models (issue 17,
bug 4b), and buffers kept by every plugin's single-file and sharded saves."""

from __future__ import annotations

import inspect
import json
import os
import warnings

import pytest
import torch

from megalith.checkpoint_io import (
    CheckpointIndexFile,
    CheckpointIO,
    GeneralCheckpointIO,
    HybridParallelCheckpointIO,
    MoECheckpointIO,
)
from megalith.testing import run_distributed
from tests.colossalai.ckpt_workers import bn_net, plugin_checks


def assert_equal(a, b, where: str = "") -> None:
    """ColossalAI's check_state_dict_equal: recursively, tensors bit for bit."""
    if isinstance(a, dict):
        assert a.keys() == b.keys(), (where, sorted(a), sorted(b))
        for k in a:
            assert_equal(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, list | tuple):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            assert_equal(x, y, f"{where}[{i}]")
    elif torch.is_tensor(a):
        assert torch.equal(a, b), where
    else:
        assert a == b, (where, a, b)


def trained(seed: int, groups: bool = False):
    model = bn_net(seed)
    if groups:
        params = [
            {"params": model[0].parameters()},
            {"params": model[4].parameters(), "lr": 2e-3},
        ]
    else:
        params = model.parameters()
    opt = torch.optim.Adam(params, lr=1e-3)
    gen = torch.Generator().manual_seed(seed)
    for _ in range(2):
        model(torch.randn(3, 3, 8, 8, generator=gen)).square().mean().backward()
        opt.step()
        opt.zero_grad()
    return model, opt


def fresh(groups: bool = False):
    model = bn_net(1234)
    if groups:
        params = [
            {"params": model[0].parameters()},
            {"params": model[4].parameters(), "lr": 2e-3},
        ]
    else:
        params = model.parameters()
    return model, torch.optim.Adam(params, lr=1e-3)


def test_signatures_are_colossalais():
    """The Booster calls each of these by keyword: the names and defaults must be ColossalAI's."""
    want = {
        "save_model": "model checkpoint shard=False gather_dtensor=True prefix=None "
        "size_per_shard=1024 use_safetensors=False use_async=False",
        "load_model": "model checkpoint strict=True low_cpu_mem_mode=True num_threads=1",
        "save_optimizer": "optimizer checkpoint shard=False gather_dtensor=True prefix=None "
        "size_per_shard=1024 use_async=False",
        "load_optimizer": "optimizer checkpoint prefix=None low_cpu_mem_mode=True num_threads=1",
        "save_lr_scheduler": "lr_scheduler checkpoint",
        "load_lr_scheduler": "lr_scheduler checkpoint",
        "save_lora_as_pretrained": "model checkpoint use_safetensors=False state_dict=None",
        "save_sharded_model": "model checkpoint gather_dtensor=True prefix=None "
        "size_per_shard=1024 use_safetensors=False use_async=False",
        "save_unsharded_model": "model checkpoint gather_dtensor=True use_safetensors=False "
        "use_async=False",
        "load_sharded_model": "model checkpoint_index_file strict=True low_cpu_mem_mode=True "
        "num_threads=1",
        "load_unsharded_model": "model checkpoint strict=True low_cpu_mem_mode=True num_threads=1",
        "save_sharded_optimizer": "optimizer checkpoint gather_dtensor=True prefix=None "
        "size_per_shard=1024 use_async=False",
        "save_unsharded_optimizer": "optimizer checkpoint gather_dtensor=True use_async=False",
        "load_sharded_optimizer": "optimizer index_file_path prefix=None low_cpu_mem_mode=True "
        "num_threads=1",
        "load_unsharded_optimizer": "optimizer checkpoint low_cpu_mem_mode=True num_threads=1",
        "synchronize": "",
    }
    for cls in (CheckpointIO, GeneralCheckpointIO, HybridParallelCheckpointIO):
        for name, sig in want.items():
            params = list(inspect.signature(getattr(cls, name)).parameters.values())[1:]
            got = " ".join(
                p.name if p.default is inspect.Parameter.empty else f"{p.name}={p.default!r}"
                for p in params
            )
            assert got == sig, f"{cls.__name__}.{name}({got})"


@pytest.mark.parametrize("use_async", [False, True])
@pytest.mark.parametrize("use_safetensors", [False, True])
def test_general_io_on_its_own_round_trips(tmp_path, use_async, use_safetensors):
    """ColossalAI's test_general_checkpoint_io, on one file and on shards: the loaded
    model and optimizer state dicts equal the saved ones, and training continues alike."""
    model, opt = trained(1, groups=True)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    sched.step()
    io = GeneralCheckpointIO()
    existing = tmp_path / "model.bin"  # ColossalAI's tests pass a NamedTemporaryFile's name
    existing.write_bytes(b"")
    io.save_model(model, str(existing), use_safetensors=use_safetensors, use_async=use_async)
    io.save_optimizer(opt, str(tmp_path / "optim"), use_async=use_async)
    io.save_model(model, str(tmp_path / "m"), True, True, "", 0.002, use_async=use_async)
    io.save_optimizer(opt, str(tmp_path / "o"), shard=True, size_per_shard=0.002)
    io.save_lr_scheduler(sched, str(tmp_path / "sched"))
    io._sync_d2h()
    io._sync_io()
    assert len(list((tmp_path / "m").glob("model-*.safetensors"))) > 1
    x = torch.randn(3, 3, 8, 8)
    for m_src, o_src in (("model.bin", "optim"), ("m", "o")):
        model2, opt2 = fresh(groups=True)
        sched2 = torch.optim.lr_scheduler.StepLR(opt2, step_size=1, gamma=0.5)
        io.load_model(model2, str(tmp_path / m_src))
        io.load_optimizer(opt2, str(tmp_path / o_src))
        io.load_lr_scheduler(sched2, str(tmp_path / "sched"))
        assert_equal(model.state_dict(), model2.state_dict(), m_src)
        assert_equal(opt.state_dict(), opt2.state_dict(), o_src)
        assert sched2.state_dict() == sched.state_dict()
        for m, o in ((model, opt), (model2, opt2)):
            torch.manual_seed(0)
            m(x).square().mean().backward()
            o.step()
            o.zero_grad()
        assert_equal(model.state_dict(), model2.state_dict(), "after a step")
        model, opt = trained(1, groups=True)  # the next source starts from the saved state
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
        sched.step()
    assert not [p for p in tmp_path.rglob(".*")], "a staging file was left behind"


def test_sgd_and_optimizers_without_a_rule_round_trip(tmp_path):
    """States are saved as torch keeps them: SGD has no step, RMSprop one of its own."""
    io = GeneralCheckpointIO()
    for make in (
        lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9),
        lambda p: torch.optim.RMSprop(p, lr=0.01),
    ):
        model = bn_net(2)
        opt = make(model.parameters())
        model(torch.randn(2, 3, 8, 8)).sum().backward()
        opt.step()
        io.save_optimizer(opt, str(tmp_path / "o.safetensors"))
        opt2 = make(bn_net(3).parameters())
        io.load_optimizer(opt2, str(tmp_path / "o.safetensors"))
        assert_equal(opt.state_dict(), opt2.state_dict(), type(opt).__name__)


def test_prefix_names_the_files_and_every_path_loads(tmp_path):
    """ColossalAI's prefix goes into the file names (model.<prefix>-00001-of-...); a load
    takes the directory, its index file, or (optimizer) the prefix to pick one."""
    model, opt = trained(4)
    io = GeneralCheckpointIO()
    io.save_model(model, str(tmp_path / "ckpt"), shard=True, prefix="best", size_per_shard=0.002)
    io.save_optimizer(opt, str(tmp_path / "ckpt"), shard=True, prefix="best", size_per_shard=0.002)
    io.save_optimizer(opt, str(tmp_path / "ckpt"), shard=True, prefix="last")
    names = sorted(os.listdir(tmp_path / "ckpt"))
    assert "model.best.safetensors.index.json" in names and "optimizer.best.json" in names
    assert any(n.startswith("model.best-00001-of-") for n in names), names
    assert "optimizer.last.safetensors" in names, names
    index = json.loads((tmp_path / "ckpt" / "model.best.safetensors.index.json").read_text())
    assert set(index["weight_map"].values()) <= set(names)
    for src in ("ckpt", "ckpt/model.best.safetensors.index.json"):
        model2, _ = fresh()
        io.load_model(model2, str(tmp_path / src))
        assert_equal(model.state_dict(), model2.state_dict(), src)
    for kwargs in ({"prefix": "best"}, {"prefix": "last"}):
        _, opt2 = fresh()
        io.load_optimizer(opt2, str(tmp_path / "ckpt"), **kwargs)
        assert_equal(opt.state_dict(), opt2.state_dict(), str(kwargs))
    _, opt2 = fresh()
    io.load_optimizer(opt2, str(tmp_path / "ckpt" / "optimizer.best.safetensors.index.json"))
    assert_equal(opt.state_dict(), opt2.state_dict(), "index path")
    with pytest.raises(ValueError, match="pass the path of one"):
        io.load_optimizer(fresh()[1], str(tmp_path / "ckpt"))


def test_checkpoint_index_file(tmp_path):
    model, _ = trained(5)
    GeneralCheckpointIO().save_model(model, str(tmp_path), shard=True, size_per_shard=0.002)
    index = CheckpointIndexFile.from_file(tmp_path / "model.safetensors.index.json")
    assert index.root_path == tmp_path
    assert sorted(index.get_all_param_names()) == sorted(model.state_dict())
    files, dtensors = index.get_checkpoint_filenames()
    assert dtensors == [] and not index.contains_dtensor()
    assert files == sorted({str(tmp_path / f) for f in index.weight_map.values()})
    assert index.get_checkpoint_file("4.bias") in {os.path.basename(f) for f in files}
    assert index.get_param_group_filename() is None
    new = CheckpointIndexFile(tmp_path / "out")
    (tmp_path / "out").mkdir()
    new.append_weight_map("w", "a.safetensors")
    new.append_meta_data("param_groups", "groups.json")
    new.append_meta_data("total_size", 12)
    new.write_index_file("x.index.json")
    back = CheckpointIndexFile.from_file(tmp_path / "out" / "x.index.json")
    assert back.weight_map == {"w": "a.safetensors"} and back.metadata["total_size"] == 12
    assert back.get_param_group_filename() == str(tmp_path / "out" / "groups.json")
    new.append_weight_map("d", "d.*.safetensors")
    assert new.contains_dtensor()
    with pytest.raises(ValueError, match="distributed tensors"):
        new.assert_no_dtensor_checkpoint()


def test_async_save_writes_the_values_at_the_call(tmp_path):
    """use_async: the tensors are copied when save_model returns; a change made before
    the write finishes is not in the files, and synchronize() waits for them."""
    model, _ = trained(6)
    want = {k: v.clone() for k, v in model.state_dict().items()}
    io = GeneralCheckpointIO()
    io.save_model(model, str(tmp_path / "m.safetensors"), use_async=True)
    io.save_model(model, str(tmp_path / "d"), shard=True, use_async=True)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    io.synchronize()
    for src in ("m.safetensors", "d"):
        model2, _ = fresh()
        io.load_model(model2, str(tmp_path / src))
        assert_equal(want, model2.state_dict(), src)


def tiny_gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(7)
    return GPT2LMHeadModel(
        GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=64, n_positions=16)
    )


def tiny_llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(8)
    config = LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
    )
    return LlamaForCausalLM(config)


@pytest.mark.parametrize("build", [tiny_gpt2, tiny_llama], ids=["gpt2", "llama"])
def test_sharded_save_of_a_transformers_model_has_its_config(tmp_path, build):
    """Bug 4b: without config.json, from_pretrained on the directory builds a default
    config (for Llama: 7B). Now AutoModelForCausalLM loads the very model that was saved."""
    from transformers import AutoModelForCausalLM

    pytest.importorskip("transformers")
    model = build()
    config_before = model.config.to_dict()
    GeneralCheckpointIO().save_model(model, str(tmp_path), shard=True, size_per_shard=0.02)
    assert (tmp_path / "config.json").is_file()
    assert (tmp_path / "generation_config.json").is_file()
    assert model.config.to_dict() == config_before, "the user's config was changed"
    loaded = AutoModelForCausalLM.from_pretrained(str(tmp_path))
    assert type(loaded) is type(model)
    assert loaded.config.num_hidden_layers == model.config.num_hidden_layers
    assert loaded.config.architectures == [type(model).__name__]
    want, got = model.state_dict(), loaded.state_dict()
    assert want.keys() == got.keys()
    for k in want:
        assert torch.equal(want[k], got[k]), k
    ids = torch.randint(0, 64, (2, 8))
    with torch.no_grad():
        assert torch.equal(model.eval()(ids).logits, loaded.eval()(ids).logits)


def test_refusals_name_the_fix(tmp_path):
    io = GeneralCheckpointIO()
    torch.save({"w": torch.ones(2)}, tmp_path / "pytorch_model.bin")
    with pytest.raises(ValueError, match="safetensors only"):
        io.load_model(bn_net(0), str(tmp_path / "pytorch_model.bin"))
    with pytest.raises(ValueError, match="safetensors only"):
        io.load_model(bn_net(0), str(tmp_path))
    assert isinstance(MoECheckpointIO(), HybridParallelCheckpointIO)
    (tmp_path / "f").write_text("x")
    with pytest.raises(ValueError, match="a sharded save writes a directory"):
        io.save_model(bn_net(0), str(tmp_path / "f"), shard=True)
    try:
        import peft  # noqa: F401
    except ImportError:
        with pytest.raises(ImportError, match="pip install peft"):
            io.save_lora_as_pretrained(bn_net(0), str(tmp_path / "lora"))


def test_performance_arguments_warn_once_and_defaults_never(tmp_path):
    model, _ = trained(9)
    io = GeneralCheckpointIO()
    io.save_model(model, str(tmp_path / "m.safetensors"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        io.load_model(bn_net(0), str(tmp_path / "m.safetensors"))  # defaults: silent
        io.save_model(model, str(tmp_path / "m.safetensors"), use_safetensors=False)
    with pytest.warns(UserWarning, match="num_threads=4 is ignored"):
        io.load_model(bn_net(0), str(tmp_path / "m.safetensors"), num_threads=4)


def test_every_plugin_keeps_buffers_in_every_save(tmp_path, gen):
    """Single-file (use_async too) and sharded saves of TorchDDP, LowLevelZero, Gemini and
    HybridParallel hold BatchNorm's running stats; a fresh model takes them back."""
    seed = int(torch.randint(0, 2**31, (1,), generator=gen))
    errors = run_distributed(plugin_checks, 2, str(tmp_path), seed, timeout=120)
    assert errors == [[], []], errors
