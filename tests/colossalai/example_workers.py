"""What each rank runs in test_examples_fixes.py: the patterns of ColossalAI's llama
benchmark (examples/language/llama/benchmark.py) and of its booster API and checkpoint
doc pages, in small, each against plain single-process torch."""

from __future__ import annotations

import warnings
from pathlib import Path

import torch

import megalith_comm as comm
from megalith.booster import Booster
from megalith.booster.plugin import GeminiPlugin, LowLevelZeroPlugin, TorchDDPPlugin
from tests.colossalai.dp_workers import _max_diff, _mine, batches, conv_bn, mlp


def gemini_auto_on_cpu(rank: int, _: object) -> dict:
    """GeminiPlugin(placement_policy="auto") on CPU ranks (the benchmark's gemini_auto):
    it boosts without set_offload, warns once naming the budget it took, and three
    AdamW steps equal torch's."""
    ref = mlp()
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-2)
    model = mlp()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    booster = Booster(plugin=GeminiPlugin(placement_policy="auto", precision="fp32"))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model, opt, *_ = booster.boost(model, opt)
    said = [str(w.message) for w in caught if "placement_policy='auto'" in str(w.message)]
    losses = []
    for x, y in batches(3):
        ref_loss = torch.nn.functional.mse_loss(ref(x), y)
        ref_loss.backward()
        ref_opt.step()
        ref_opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(_mine(x)), _mine(y))
        booster.backward(loss, opt)
        opt.step()
        opt.zero_grad()
        total = loss.detach().clone()
        ref_loss = ref_loss.detach()
        comm.all_reduce(total)
        losses.append(abs(float(total) / comm.get_world().world_size - ref_loss.item()))
    got = model.state_dict(only_rank_0=False)
    return {"warned": said, "loss": max(losses), "params": _max_diff(got, ref.state_dict())}


def booster_api_page(rank: int, directory: str) -> dict:
    """The booster API page's loop in small (a conv net with BatchNorm for its resnet18):
    StepLR built before boost, boost(model, optimizer, criterion, lr_scheduler=...),
    booster.backward, clip_grad_by_norm(1.0), step, scheduler step, zero_grad, then
    save_model(shard=True, size_per_shard=..., use_safetensors=True) and load_model into
    a new model that was never boosted. Parameters against torch with each rank's
    BatchNorm statistics (CPU ranks keep them per rank)."""
    world = comm.get_world().world_size
    g = torch.Generator().manual_seed(3)
    data = [torch.randn(world * 2, 3, 6, 6, generator=g) for _ in range(2)]
    ref = conv_bn()
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.5)
    ref_sched = torch.optim.lr_scheduler.StepLR(ref_opt, step_size=1, gamma=0.1)
    for x in data:
        loss = sum(ref(x[r * 2 : (r + 1) * 2]).mean() for r in range(world)) / world
        loss.backward()
        torch.nn.utils.clip_grad_norm_(ref.parameters(), 1.0)
        ref_opt.step()
        ref_sched.step()
        ref_opt.zero_grad()
    booster = Booster(plugin=TorchDDPPlugin())
    model = conv_bn()
    criterion = lambda x: x.mean()  # noqa: E731  (the page's)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # CPU ranks: BatchNorm statistics stay per rank
        model, optimizer, criterion, _, scheduler = booster.boost(
            model, optimizer, criterion, lr_scheduler=scheduler
        )
    for x in data:
        loss = criterion(model(x[rank * 2 : (rank + 1) * 2]))
        booster.backward(loss, optimizer)
        optimizer.clip_grad_by_norm(1.0)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
    size = sum(p.numel() * 4 for p in model.parameters()) / 2**20 / 3  # about 3 shards
    booster.save_model(model, directory, shard=True, size_per_shard=size, use_safetensors=True)
    comm.barrier()
    new_model = conv_bn()
    with torch.no_grad():
        for p in new_model.parameters():
            p.add_(1.0)  # differs from what was saved
    booster.load_model(new_model, directory)
    # rank 0 writes the files: its BatchNorm statistics are the saved ones
    trained = model.unwrap().state_dict() if rank == 0 else dict(model.unwrap().named_parameters())
    want = {n: p.detach() for n, p in ref.named_parameters()}
    return {
        "params": _max_diff(dict(model.unwrap().named_parameters()), want),
        "loaded": _max_diff(new_model.state_dict(), trained),
        "shards": len(list(Path(directory).glob("*.safetensors"))),
        "index": (Path(directory) / "model.safetensors.index.json").is_file(),
        "lr": optimizer.param_groups[0]["lr"] - ref_opt.param_groups[0]["lr"],
    }


def checkpoint_page(rank: int, pretrained: str) -> dict:
    """The checkpoint page's recipe: a Llama built in LazyInitContext on the current
    device, boosted with an optimizer, then load_model from a from_pretrained directory
    (what snapshot_download gives): the boosted model holds the pretrained weights,
    under GeminiPlugin and LowLevelZeroPlugin."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from megalith.lazy import LazyInitContext
    from megalith.nn.optimizer import HybridAdam
    from megalith.utils import get_current_device

    want = LlamaForCausalLM.from_pretrained(pretrained).state_dict()
    config = LlamaConfig.from_pretrained(pretrained)
    out = {}
    for name, plugin in (("gemini", GeminiPlugin()), ("zero2", LowLevelZeroPlugin(stage=2))):
        booster = Booster(plugin=plugin)
        with LazyInitContext(default_device=get_current_device()):
            model = LlamaForCausalLM(config)
        optimizer = HybridAdam(model.parameters(), lr=1e-3)
        model, optimizer, *_ = booster.boost(model, optimizer)
        booster.load_model(model, pretrained)
        got = model.state_dict(only_rank_0=False) if name == "gemini" else model.state_dict()
        # fp16 working copies (both plugins' default precision): compare at fp16's step
        out[name] = _max_diff(got, want) / max(float(t.abs().max()) for t in want.values())
    return out


def mixed(rank: int, setting: tuple[str, object]) -> object:
    kind, arg = setting
    return globals()[kind](rank, arg)
