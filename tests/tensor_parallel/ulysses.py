"""All-to-all sequence parallelism trains as the unsharded model."""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass

import torch

from megalith.tensor_parallel.ulysses import apply_ulysses
from tests.tensor_parallel.common import check, exact_entries, mesh
from tests.tensor_parallel.models import SEQ, VOCAB, ModelCase, build


@dataclass(frozen=True)
class UlyssesCase:
    family: str = "llama"
    sp: int = 2
    steps: int = 2

    def run(self, rank: int) -> tuple[list[str], float]:
        start = time.perf_counter()
        group = mesh(1, self.sp).group("tp")
        ref = build(ModelCase("megalith", self.family))
        model = apply_ulysses(copy.deepcopy(ref), group)
        opt_ref = torch.optim.AdamW(ref.parameters(), lr=1e-3)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        gen = torch.Generator().manual_seed(5)
        errors: list[str] = []
        for step in range(self.steps):
            ids = torch.randint(0, VOCAB, (2, SEQ), generator=gen)
            loss_ref = ref(ids, labels=ids).loss
            loss_ref.backward()
            loss = model(ids, labels=ids).loss
            loss.backward()
            check(errors, f"step {step} loss", loss, loss_ref)
            if step == 0:
                refs = dict(ref.named_parameters())
                for name, p in model.named_parameters():
                    check(errors, f"grad {name}", p.grad, refs[name].grad)
            for o in (opt_ref, opt):
                o.step()
                o.zero_grad()
        refs = dict(ref.named_parameters())
        for name, p in model.named_parameters():
            keep = exact_entries(name, p)
            check(errors, f"weight {name}", p[keep], refs[name][keep])
        return errors, time.perf_counter() - start
