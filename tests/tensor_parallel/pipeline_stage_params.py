"""Workers for test_pipeline_stage_params.py: under HybridParallelPlugin(pp_size > 1) each
rank holds only its stages' parameters (the rest of the model given to boost() is freed
to the meta device), the optimizer holds only those, the stages together hold the whole
model, losses equal the whole model's in one process, and a weight tied across stages
(GPT-2's embedding and LM head) stays equal on its two stages, under ZeRO too."""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass

import torch

import megalith_comm as comm
from megalith.booster import Booster
from megalith.booster.plugin import HybridParallelPlugin
from megalith.tensor_parallel import gather_full
from tests.tensor_parallel.common import check, check_trained, exact_entries
from tests.tensor_parallel.pipeline_plugin import SEQ, VOCAB, build, check_reload, criterion


@dataclass(frozen=True)
class StageParamsCase:
    family: str = "gpt2"  # GPT-2 ties its LM head to its token embedding
    tp: int = 1
    zero_stage: int = 0
    style: str = "1f1b"
    chunks: int = 1
    microbatches: int = 2
    layers: int = 2
    steps: int = 2
    checkpoint: bool = False
    cpu_offload: bool = False
    refused: str = ""  # boost() must refuse, naming this
    accumulate: bool = False  # two execute_pipeline calls per step, the first in no_sync

    def run(self, rank: int) -> tuple[list[str], float]:
        start = time.perf_counter()
        ref = build(self.family, self.layers)
        start_params = {n: p.detach().clone() for n, p in ref.named_parameters()}
        model = copy.deepcopy(ref)
        plugin = HybridParallelPlugin(
            tp_size=self.tp, pp_size=2, pp_style=self.style, num_model_chunks=self.chunks,
            num_microbatches=self.microbatches,
            zero_stage=self.zero_stage, parallel_output=False, cpu_offload=self.cpu_offload,
        )  # fmt: skip
        booster = Booster(plugin=plugin)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.1)
        given = model
        errors: list[str] = []
        if self.refused:
            try:
                booster.boost(model, opt)
                errors.append("boost() took it")
            except ValueError as exc:
                if self.refused not in str(exc):
                    errors.append(f"refused with: {exc}")
            return errors, time.perf_counter() - start
        model, opt, *_ = booster.boost(model, opt)
        check_stage_params(given, model, opt, plugin, errors)
        opt_ref = torch.optim.AdamW(ref.parameters(), lr=1e-3, weight_decay=0.1)
        dp_rank, dp = plugin.dp_rank_size
        gen = torch.Generator().manual_seed(fresh_seed())
        for step in range(self.steps):
            ids = torch.randint(0, VOCAB, (2 * self.microbatches * dp, SEQ), generator=gen)
            want = ref(ids, labels=ids).loss
            want.backward()
            mine = ids.chunk(dp)[dp_rank]
            if self.accumulate:  # a second batch, its gradients added to the step's
                more = torch.randint(0, VOCAB, ids.shape, generator=gen)
                ref(more, labels=more).loss.backward()
                extra = more.chunk(dp)[dp_rank]
                with booster.no_sync(model, opt):
                    booster.execute_pipeline(
                        iter([{"input_ids": extra, "labels": extra}]), model, criterion, opt
                    )
            opt_ref.step()
            opt_ref.zero_grad()
            out = booster.execute_pipeline(
                iter([{"input_ids": mine, "labels": mine}]), model, criterion, opt
            )
            loss = out["loss"].detach().reshape(1).float()
            comm.all_reduce(loss, op="avg", group=plugin.mesh.group("dp"))
            check(errors, f"loss at step {step}", loss[0], want.detach(), 1e-5)
            opt.step()
            opt.zero_grad()
        ref_params = dict(ref.named_parameters())
        trained = {}
        for name, p in plugin.local_named_parameters(model).items():
            full = gather_full(p, plugin.mesh.group("tp"))
            trained[name] = full.detach()
            keep = exact_entries(name, ref_params[name])
            want = ref_params[name].detach()[keep]
            check_trained(errors, f"weight {name}", full[keep], want, start_params[name][keep])
        check_tied_copies(model, errors)
        if self.checkpoint:
            check_reload(booster, model, trained, self.family, self.layers, errors)
        return errors, time.perf_counter() - start


def _unique(params) -> dict[int, torch.nn.Parameter]:
    return {id(p): p for p in params}


def check_stage_params(given, model, opt, plugin, errors: list[str]) -> None:
    """What boost() was given holds real storage only for this rank's stages; the
    optimizer steps exactly those; over the pp group the stages add up to the model."""
    local = _unique(model.unwrap().parameters())
    held = {k: p for k, p in _unique(given.parameters()).items() if not p.is_meta}
    if held.keys() != local.keys():
        errors.append(f"{len(held)} materialised parameters, the stages have {len(local)}")
    stepped = {id(p) for g in opt.param_groups for p in g["params"]}
    if stepped != local.keys():
        errors.append(f"the optimizer steps {len(stepped)} parameters, the stages {len(local)}")
    if any(b.is_meta for b in model.unwrap().buffers()):
        errors.append("a stage's buffer was freed")
    secondary = {id(p) for p in model.pipe.tied.secondary_copies()}
    counted = torch.tensor([float(sum(p.numel() for k, p in local.items() if k not in secondary))])
    comm.all_reduce(counted, group=plugin.mesh.group("pp"))
    whole = sum(p.numel() for p in _unique(given.parameters()).values())  # shapes stay
    if int(counted) != whole:
        errors.append(f"the stages hold {int(counted)} parameters, the model {whole}")


def check_tied_copies(model, errors: list[str]) -> None:
    """Every copy of a weight tied across stages equals the first stage's."""
    tied = model.pipe.tied
    for holders, uses in tied.ties:
        group = tied._groups.get(holders)
        if group is None:
            continue
        for p in tied._local(uses):
            first = p.detach().clone()
            comm.broadcast(first, src=group.global_rank(0), group=group)
            check(errors, "tied copy", p.detach(), first, 1e-7)


def fresh_seed() -> int:
    """A new seed per run, rank 0's on every rank (printed with a failure's output)."""
    import os

    seed = torch.tensor([int.from_bytes(os.urandom(3), "little")])
    comm.broadcast(seed, src=0)
    print(f"seed={int(seed)}")
    return int(seed)
