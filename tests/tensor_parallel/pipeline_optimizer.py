"""Rank workers: a pipelined model's optimizer files (Booster.save_optimizer) are the
layout-free ones every plugin writes. Train a few steps under one layout, save model and
optimizer, load both under another layout (pipelined with another tp, not pipelined,
plain DDP), train on; the weights must be those of one uninterrupted run in one process."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch

import megalith_comm as comm
from megalith.booster import Booster
from megalith.booster.plugin import HybridParallelPlugin, TorchDDPPlugin
from megalith.tensor_parallel import gather_full
from tests.tensor_parallel.common import check, exact_entries, expect_value_error
from tests.tensor_parallel.pipeline_plugin import SEQ, VOCAB, build, criterion

BATCH, LR, WD = 12, 1e-3, 0.1  # BATCH: whole micro-batches at dp 1, 2 and 4


@dataclass(frozen=True)
class Layout:
    """tp x pp (x dp: the rest of the world) with ZeRO stage; ddp: TorchDDPPlugin."""

    tp: int = 1
    pp: int = 1
    zero_stage: int = 0
    style: str = "1f1b"
    chunks: int = 1
    ddp: bool = False

    def __str__(self) -> str:
        if self.ddp:
            return "ddp"
        style = f" {self.style}" if self.pp > 1 and self.style != "1f1b" else ""
        return f"tp{self.tp} pp{self.pp}{style} zero{self.zero_stage}"

    def boost(self, model: torch.nn.Module, lr: float = LR, sgd: bool = False):
        if self.ddp:
            plugin = TorchDDPPlugin()
        else:
            plugin = HybridParallelPlugin(
                tp_size=self.tp,
                pp_size=self.pp,
                zero_stage=self.zero_stage,
                pp_style=self.style,
                num_model_chunks=self.chunks,
                num_microbatches=2 if self.pp > 1 else None,
            )
        booster = Booster(plugin=plugin)
        if sgd:
            opt = torch.optim.SGD(model.parameters(), lr=lr)
        else:
            opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=WD)
        model, opt, *_ = booster.boost(model, opt)
        return booster, plugin, model, opt

    def step(self, booster, plugin, model, opt, ids: torch.Tensor) -> None:
        dp_rank, dp = plugin.dp_rank_size
        mine = ids.chunk(dp)[dp_rank]
        if self.pp > 1:
            batch = {"input_ids": mine, "labels": mine}
            booster.execute_pipeline(iter([batch]), model, criterion, opt)
        else:
            booster.backward(model(input_ids=mine, labels=mine).loss, opt)
        opt.step()
        opt.zero_grad()

    def weights(self, plugin, model) -> dict[str, torch.Tensor]:
        """This rank's parameters as full tensors, by their names in the model."""
        if self.ddp:
            return {n: p.detach() for n, p in model.unwrap().named_parameters()}
        tp = plugin.mesh.group("tp")
        local = plugin.local_named_parameters(model)
        return {n: gather_full(p, tp).detach() for n, p in local.items()}


@dataclass(frozen=True)
class ResumeCase:
    save: Layout
    load: Layout
    family: str = "gpt2"
    layers: int = 4
    before: int = 2  # steps before the checkpoint
    after: int = 2  # steps after it
    wrong_kind: bool = False  # also: loading into SGD under the load layout fails, named

    def __str__(self) -> str:
        return f"{self.family}: {self.save} -> {self.load}"

    def run(self, rank: int) -> tuple[list[str], float]:
        start = time.perf_counter()
        errors: list[str] = []
        gen = torch.Generator().manual_seed(7)
        batches = [
            torch.randint(0, VOCAB, (BATCH, SEQ), generator=gen)
            for _ in range(self.before + self.after)
        ]
        ref = build(self.family, self.layers)
        opt_ref = torch.optim.AdamW(ref.parameters(), lr=LR, weight_decay=WD)
        for ids in batches:
            ref(input_ids=ids, labels=ids).loss.backward()
            opt_ref.step()
            opt_ref.zero_grad()

        path = os.path.join(tempfile.gettempdir(), f"megalith-pp-optim-{os.getppid()}")
        booster, plugin, model, opt = self.save.boost(build(self.family, self.layers))
        for ids in batches[: self.before]:
            self.save.step(booster, plugin, model, opt, ids)
        booster.save_model(model, os.path.join(path, "model"), shard=True, size_per_shard=1)
        booster.save_optimizer(opt, os.path.join(path, "optim"), shard=True, size_per_shard=1)
        check_files(Path(path, "optim"), build(self.family, self.layers), self.before, errors)

        fresh = build(self.family, self.layers)
        with torch.no_grad():  # another start, so a load that does nothing shows
            for p in fresh.parameters():
                p.mul_(0.5)
        # the lr (and every hyperparameter) comes from the files
        booster, plugin, model, opt = self.load.boost(fresh, lr=10 * LR)
        booster.load_model(model, os.path.join(path, "model"))
        booster.load_optimizer(opt, os.path.join(path, "optim"))
        for ids in batches[self.before :]:
            self.load.step(booster, plugin, model, opt, ids)
        want = dict(ref.named_parameters())
        mine = self.load.weights(plugin, model)
        if not mine:
            errors.append("no parameters on this rank")
        for name, full in mine.items():
            keep = exact_entries(name, want[name])
            check(errors, f"weight {name}", full[keep].float(), want[name].detach()[keep], 1e-5)
        if self.wrong_kind:
            other, _, _, sgd = self.load.boost(build(self.family, self.layers), sgd=True)
            load = lambda: other.load_optimizer(sgd, os.path.join(path, "optim"))  # noqa: E731
            expect_value_error(errors, "AdamW files into SGD", load, "adam")
        comm.barrier()
        if comm.get_world().rank == 0:
            shutil.rmtree(path, ignore_errors=True)
        return errors, time.perf_counter() - start


def check_files(path: Path, model: torch.nn.Module, steps: int, errors: list[str]) -> None:
    """optimizer.json names every parameter once (a weight tied across stages too) with
    its step count, and the files hold each one's AdamW moments as full tensors."""
    from safetensors.torch import load_file

    meta = json.loads((path / "optimizer.json").read_text())
    params = dict(model.named_parameters())  # tied weights once, under their first name
    if sorted(meta["params"]) != sorted(params):
        extra = sorted(set(meta["params"]) - set(params))[:3]
        missing = sorted(set(params) - set(meta["params"]))[:3]
        errors.append(f"optimizer.json params: extra {extra}, missing {missing}")
    steps_saved = {v["step"] for v in meta["params"].values()}
    if steps_saved != {steps}:
        errors.append(f"optimizer.json steps {sorted(steps_saved)}, want {steps}")
    if meta["kind"] != "adam" or meta["param_groups"][0]["lr"] != LR:
        errors.append(f"optimizer.json kind {meta['kind']}, groups {meta['param_groups']}")
    tensors = {k: v for f in sorted(path.glob("*.safetensors")) for k, v in load_file(f).items()}
    want = {
        f"{n}::{s}": tuple(p.shape) for n, p in params.items() for s in ("exp_avg", "exp_avg_sq")
    }
    got = {k: tuple(v.shape) for k, v in tensors.items()}
    if got != want:
        bad = sorted(k for k in set(got) | set(want) if got.get(k) != want.get(k))[:3]
        errors.append(f"optimizer files: {len(got)} tensors, want {len(want)}; differ: {bad}")
