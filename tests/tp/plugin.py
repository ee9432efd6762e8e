"""HybridParallelPlugin through the Booster against the unsharded model in one process."""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass

import torch

from megalith.booster import Booster
from megalith.booster.plugin import HybridParallelPlugin
from megalith.tensor_parallel import gather_full

from .common import check, exact_entries
from .models import SEQ, VOCAB, ModelCase, build, loss_of


@dataclass(frozen=True)
class PluginCase:
    family: str = "llama"
    zero_stage: int = 0
    sp: bool = False
    max_norm: float = 0.0
    accumulate: int = 1
    steps: int = 2

    def run(self, rank: int) -> tuple[list[str], float]:
        start = time.perf_counter()
        model_case = ModelCase("megalith", self.family)
        ref = build(model_case)
        plugin = HybridParallelPlugin(
            tp_size=2,
            zero_stage=self.zero_stage,
            enable_sequence_parallelism=self.sp,
            max_norm=self.max_norm,
        )
        model = copy.deepcopy(ref)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.1)
        model, opt, *_ = Booster(plugin=plugin).boost(model, opt)
        opt_ref = torch.optim.AdamW(ref.parameters(), lr=1e-3, weight_decay=0.1)
        dp_rank, dp = plugin.dp_rank_size
        gen = torch.Generator().manual_seed(5)
        errors: list[str] = []
        for _ in range(self.steps):
            for micro in range(self.accumulate):
                ids = torch.randint(0, VOCAB, (2 * dp, SEQ), generator=gen)
                (loss_of(ref, ids, model_case, None) / self.accumulate).backward()
                loss = loss_of(model, ids.chunk(dp)[dp_rank], model_case, None) / self.accumulate
                if micro < self.accumulate - 1:
                    with plugin.no_sync(model, opt):
                        opt.backward(loss)
                else:
                    opt.backward(loss)
            if self.max_norm:
                torch.nn.utils.clip_grad_norm_(ref.parameters(), self.max_norm)
            opt_ref.step()
            opt.step()
            opt_ref.zero_grad()
            opt.zero_grad()
        ref_params = dict(ref.named_parameters())
        tp_group = plugin.mesh.group("tp")
        for name, p in model.unwrap().named_parameters():
            full, want = gather_full(p, tp_group), ref_params[name].detach()
            keep = exact_entries(name, want)
            check(errors, f"weight {name}", full[keep], want[keep])
        return errors, time.perf_counter() - start
