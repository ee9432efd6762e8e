"""Offloaded ZeRO on a GPU (skipped without one): the host update through pinned staging
and copy streams, during backward (step_in_backward) and after it, against ZeRO with
every state on the device; and device chunks updated during backward on the step
stream. The host and device kernels round alike but not bit-equally
(FMA contraction differs), so fp32 runs agree to 1e-5 relative after 10 steps. Stage 3
also with every parameter shard in host memory (param_frac=1), and the masters on NVMe
(master_tier="nvme") at both stages."""

from __future__ import annotations

import pytest
import torch

from megalith.testing import run_grid
from tests.offload.worker import Case, train

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.mark.parametrize("stage", [2, 3])
def test_host_offload_on_cuda_matches_device(stage, tmp_path):
    cases = [
        Case(stage=stage, steps=10, device="cuda"),
        Case(stage=stage, tier="host", steps=10, device="cuda"),
        Case(stage=stage, tier="host", eager=True, steps=10, device="cuda"),
        Case(stage=stage, eager=True, steps=10, device="cuda"),  # device chunks, step stream
        # half the host chunks updated on the GPU, their states streamed through slots
        Case(stage=stage, tier="host", eager=True, visit_frac=0.5, steps=10, device="cuda"),
        # the fraction chosen from step 1's host-kernel and link timings
        Case(stage=stage, tier="host", visit_frac="auto", steps=10, device="cuda"),
    ]
    if stage == 3:  # parameter shards in pinned host memory, copied up per gather
        cases.append(
            Case(stage=3, tier="host", eager=True, param_frac=1.0, steps=10, device="cuda")
        )
        # and in swap files, read through the pinned ring, half of them
        swap = str(tmp_path / "swap")
        cases.append(
            Case(
                stage=3,
                tier="nvme",
                param_frac=0.5,
                param_tier="nvme",
                swap_dir=swap,
                steps=10,
                device="cuda",
            )
        )
    # fp32 masters in the swap files beside the states (master_tier="nvme")
    swap = str(tmp_path / "swap")
    cases.append(
        Case(stage=stage, tier="nvme", master_tier="nvme", swap_dir=swap, steps=10, device="cuda")
    )
    results = [r[0] for r in run_grid(train, cases, 1, backend="nccl", timeout=240)]
    base = results[0]
    for case, r in zip(cases[1:], results[1:]):
        assert not isinstance(r, tuple), r
        want = {"none": {"device"}, "host": {"host"}, "nvme": {"nvme"}}[case.tier]
        assert set(r["tiers"]) == want, r["tiers"]
        for a, b in zip(r["losses"], base["losses"]):
            assert abs(a - b) <= 1e-5 * abs(b), (case, r["losses"], base["losses"])
        for name, ref in base["params"].items():
            got = r["params"][name].cpu()
            err = float((got - ref.cpu()).norm() / ref.norm().clamp_min(1e-30))
            assert err < 1e-5, f"{case}: {name} differs by {err:.3g}"
        if case.tier == "host":  # pinned staging used
            assert r["report"]["grad_staging@host"][0] > 0, r["report"]
        if case.master_tier == "nvme":
            assert r["report"]["master@nvme"][0] > 0 and r["report"]["master@host"][0] == 0
        if case.param_frac:
            kind = "params@nvme" if case.param_tier == "nvme" else "params@host"
            assert r["report"][kind][0] > 0, r["report"]
        assert r["visits_ran"] == bool(r["visited"]), case
        if case.visit_frac == "auto":
            print(
                f"stage {stage}: visit_frac auto -> {r['visit_frac']}, timing {r['visit_timing']}"
            )
            assert r["visit_timing"][0] > 0, r["visit_timing"]
