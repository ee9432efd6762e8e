"""A meta-device model, sharded, then materialised shard by shard, equals the model
built whole, and trains alike (the sequence-parallel gradient hooks survive)."""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

import megalith.models as mm
from megalith.tensor_parallel import (
    full_state_dict,
    gather_full,
    load_full_state_dict,
    materialize_sharded,
    shard_model,
)
from tests.tensor_parallel.common import check, mesh
from tests.tensor_parallel.models import SEQ, VOCAB, ModelCase, build


@dataclass(frozen=True)
class MetaCase:
    family: str = "llama"
    tp: int = 2

    def run(self, rank: int) -> tuple[list[str], float]:
        start = time.perf_counter()
        group = mesh(1, self.tp).group("tp")
        ref = build(ModelCase("megalith", self.family))
        model = mm.create(ref.config)  # meta
        shard_model(model, group, sequence_parallel=True)
        if any(not p.is_meta for p in model.parameters()):
            return ["sharding a meta model allocated parameters"], 0.0
        materialize_sharded(model, "cpu", seed=0)
        errors: list[str] = []
        full = full_state_dict(model)
        for name, want in ref.state_dict().items():
            check(errors, f"value {name}", full[name], want, tol=1e-7)
        other = mm.create(ref.config, device="cpu", seed=7).state_dict()
        load_full_state_dict(model, other)
        reloaded = full_state_dict(model)
        for name, want in other.items():
            check(errors, f"reloaded {name}", reloaded[name], want, tol=1e-7)
        load_full_state_dict(model, ref.state_dict())
        ids = torch.randint(0, VOCAB, (2, SEQ), generator=torch.Generator().manual_seed(1))
        ref(ids, labels=ids).loss.backward()
        model(ids, labels=ids).loss.backward()
        refs = dict(ref.named_parameters())
        for name, p in model.named_parameters():
            g = gather_full(p.grad, group, getattr(p, "tp_spec", None))
            check(errors, f"grad {name}", g, refs[name].grad)
        return errors, time.perf_counter() - start
