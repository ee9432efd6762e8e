"""Lean Adam states (HybridAdam(state_dtype="bf16"/"int8")) inside ZeRO's chunks, on the
device tier, the host tier and NVMe ([Note: lean chunk states] in
megalith_core.optim.flat_states).

- World 1 against CPUAdam(state_dtype=...) on a plain copy fed the chunks' gradients:
  with a layout of whole q8 blocks (the Aligned model: 512- and 1024-element parameters)
  int8 is equal bit for bit at every step (params, codes and scales) and fp32 too; bf16
  is equal after the first step (the update uses the unrounded fp32 moments) with each
  state one of the two bf16 neighbours of the same value, and later within 0.05 lr per
  step (the chunk's rounding stream is not a parameter's). On the toy model, whose
  chunks cut through parameters (other q8 blocks), int8 stays within 0.25 lr per step.
- Worlds 2 and 3 (uneven): 20 steps of the toy model with bf16 / int8 states stay
  within 0.2% of the fp32-state losses (measured: 0.007% bf16, 0.03% int8); the host
  tier and NVMe give the device tier's values bit for bit; the memory report (the
  engine's accounting) and megalith_zero.estimate count the lean bytes exactly.
- Resume from a sharded checkpoint is bit-identical; the full files (fp32 with the
  format in optimizer.json) resume bf16 bit-identically too.
"""

from __future__ import annotations

import pytest
import torch

import megalith_zero as zero
from megalith.optim import HybridAdam
from megalith.testing import run_grid
from megalith_core.optim import flat_states
from megalith_zero.estimate import estimate
from tests.zero import toy
from tests.zero.lean_worker import LR, LeanCase, chunk_and_reference, train


def _adjacent_bf16(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Every element equal or the next bf16 value (same sign: roundings of one value)."""
    d = a.view(torch.int16).int() - b.view(torch.int16).int()
    return bool(d.abs().max() <= 1)


WORLD1 = [
    LeanCase("fp32", steps=4, aligned=True, chunk_bytes=8192),
    LeanCase("int8", steps=4, aligned=True, chunk_bytes=8192),
    LeanCase("bf16", steps=4, aligned=True, chunk_bytes=8192),
    LeanCase("bf16", steps=1, aligned=True, chunk_bytes=8192),
    LeanCase("int8", steps=4),
]


def test_world1_chunk_step_matches_cpuadam():
    results = run_grid(chunk_and_reference, WORLD1, 1, timeout=240)
    for case, per_rank in zip(WORLD1, results):
        out, ref_states, chunk_states = per_rank[0]
        for i, (mine, ref) in enumerate(out, start=1):
            diff = max(float((mine[k] - ref[k]).abs().max()) for k in ref)
            if case.aligned and (case.state_dtype != "bf16" or i == 1):
                assert diff == 0.0, f"{case} step {i}: params differ by {diff}"
            elif case.aligned:
                assert diff <= 0.05 * LR * i, f"{case} step {i}: {diff}"
            else:
                assert 0 < diff <= 0.25 * LR * i, f"{case} step {i}: {diff}"
        if not case.aligned:
            continue
        for name, ref in ref_states.items():
            states, sl = chunk_states[name]
            if case.state_dtype == "int8":
                b = slice(sl.start // 256, -(-sl.stop // 256))
                for n in ("exp_avg", "exp_avg_sq"):
                    assert torch.equal(states[n][sl], ref[n].reshape(-1)), f"{name} {n} codes"
                    assert torch.equal(states[f"{n}_scale"][b], ref[f"{n}_scale"]), f"{name} {n}"
            elif case.state_dtype == "bf16" and case.steps == 1:
                for n in ("exp_avg", "exp_avg_sq"):
                    assert states[n].dtype == torch.bfloat16
                    assert _adjacent_bf16(states[n][sl], ref[n].reshape(-1)), f"{name} {n}"
            elif case.state_dtype == "fp32":
                for n in ("exp_avg", "exp_avg_sq"):
                    assert torch.equal(states[n][sl], ref[n].reshape(-1)), f"{name} {n}"


def _cases(world: int) -> list[LeanCase]:
    out = [LeanCase(f) for f in ("fp32", "bf16", "int8")]
    if world == 2:  # the tiers once, at the even world size
        out += [LeanCase(f, offload="host") for f in ("bf16", "int8")]
        out += [LeanCase("int8", offload="nvme"), LeanCase("bf16", stage=3)]
    return out


@pytest.mark.parametrize("world_size", [2, 3])
def test_training_close_to_fp32_states(world_size):
    cases = _cases(world_size)
    results = run_grid(train, cases, world_size, timeout=240)
    got = {case: per_rank[0] for case, per_rank in zip(cases, results)}
    fp32 = got[cases[0]][0]
    for case, (losses, params, report, counted) in got.items():
        rel = max(abs(a - b) / b for a, b in zip(losses, fp32))
        assert rel < 2e-3, f"{case}: loss {rel:.3%} off fp32 states"
        assert all(map(torch.isfinite, map(torch.tensor, losses)))
        where = {"": "optim_states", "host": "optim_states@host"}.get(case.offload)
        if where is not None:  # the engine's accounting: the lean bytes exactly
            assert report[where][0] == counted, f"{case}: {report[where]} != {counted}"
        if case.offload:  # the host step is the device tier's, bit for bit
            device = got[LeanCase(case.state_dtype, stage=case.stage)]
            assert losses == device[0], f"{case} differs from the device tier"
            for k in params:
                assert torch.equal(params[k], device[1][k]), f"{case}: {k}"
    # 2 + 8/256 bytes per int8 state value, 2 for bf16, 4 for fp32 (two states each)
    b32, b16, b8 = (got[LeanCase(f)][3] for f in ("fp32", "bf16", "int8"))
    assert b16 * 2 == b32 and b8 < 0.52 * b16
    for f, counted in (("fp32", b32), ("bf16", b16), ("int8", b8)):  # the plan says the same
        model = toy.make_model(0)
        opt = HybridAdam(toy.param_groups(model, 0.1), lr=LR, state_dtype=f)
        config = zero.ZeroConfig(stage=2, chunk_bytes=LeanCase(f).chunk_bytes)
        est = estimate(model, opt, config, world_size)
        assert est.device["masters_and_states"] == counted, f


def test_bytes_per_state_value():
    n = 1000
    assert flat_states.nbytes(("exp_avg", "exp_avg_sq"), "fp32", n) == 8 * n
    assert flat_states.nbytes(("exp_avg", "exp_avg_sq"), "bf16", n) == 4 * n
    assert flat_states.nbytes(("exp_avg", "exp_avg_sq"), "int8", n) == 2 * n + 8 * 4


def test_resume_bit_identical(tmp_path):
    cases, resumed = [], []
    for f, offload, full in [
        ("bf16", "", False),
        ("int8", "", False),
        ("bf16", "host", False),
        ("int8", "host", False),
        ("bf16", "", True),  # the full files: fp32 values of bf16 states round-trip exactly
    ]:
        d = str(tmp_path / f"{f}{offload}{full}")
        cases.append(LeanCase(f, steps=8, offload=offload, save_after=4, save_dir=d, full=full))
        resumed.append(LeanCase(f, steps=8, offload=offload, resume=d, full=full, first_step=4))
    first = run_grid(train, cases, 2, timeout=240)
    again = run_grid(train, resumed, 2, timeout=240)
    for case, a, b in zip(cases, first, again):
        (la, pa, _, _), (lb, pb, _, _) = a[0], b[0]
        assert la[4:] == lb, f"{case}: resumed losses differ"
        for k in pa:
            assert torch.equal(pa[k], pb[k]), f"{case}: {k} differs after resume"
