"""The boosted optimizer and model against plain torch (ColossalAI's OptimizerWrapper and
ModelWrapper contract) under every data-parallel plugin, fp32, world sizes 2 and 3.

Each rank trains its share of the same global batches; the plain torch run (one
process, whole batches) must give the same losses, get_grad_norm values, clipped
norms, LR schedule (a StepLR built on the user's optimizer before boost), optimizer
state_dict (torch's form, whole states), the same step after load_state_dict of a
changed torch state dict, and the same final parameters.
"""

from __future__ import annotations

import pytest

from megalith.testing import run_grid
from tests.colossalai.dp_workers import boosted_objects

PLUGINS = ["ddp", "zero1", "zero2", "gemini", "fsdp"]
TOL = 2e-5


@pytest.mark.parametrize("world_size", [2, 3])
def test_boosted_objects_match_torch(world_size):
    results = run_grid(boosted_objects, PLUGINS, world_size, timeout=120)
    for name, per_rank in zip(PLUGINS, results):
        for rank, r in enumerate(per_rank):
            where = f"{name} rank {rank}"
            assert max(map(abs, r["loss"])) < TOL, (where, r["loss"])
            assert max(map(abs, r["norm"])) < TOL, (where, "get_grad_norm", r["norm"])
            assert abs(r["clip"]) < TOL, (where, "clip_grad_by_norm", r["clip"])
            assert max(map(abs, r["lr"])) == 0.0, (where, "lr schedule", r["lr"])
            assert r["state"] < TOL, (where, "optimizer state_dict", r["state"])
            assert r["params"] < TOL, (where, "params after load_state_dict + step", r["params"])
            assert r["unwrap"] != "ModelWrapper" and r["unwrap_opt"], where
            if name == "gemini":
                assert r["rank0_only_empty"], (where, "state_dict(only_rank_0=True)")
                assert r["opt_rank0_only"], (where, "optimizer state_dict(only_rank_0=True)")
                assert r["load"] < 1e-6, (where, "model.load_state_dict", r["load"])
