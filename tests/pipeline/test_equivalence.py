"""Every schedule equals the model run whole in one process: loss, every gradient, and the
weights after an SGD step (fp32, 1e-5 relative), at pp 2, 3 and 4 with 1, pp, 2pp and an odd
number of micro-batches; interleaved with 2 chunks per rank.

One process group per world size runs every case (spawning ranks costs seconds). Models
rotate over the cases: an MLP, a model passing dicts and tuples with tensors that need no
grad (a float mask, integer ids, a None) and a GPT-2 laid out as transformers lays it
out, with its LM head tied to the embedding (gradients summed over the first and last
stage). Batches are 2m + 1 samples, so micro-batches differ in size.
"""

from __future__ import annotations

import pytest

from megalith.testing import run_grid
from megalith_pipeline import SCHEDULES
from tests.pipeline.checks import Case, check_against_reference
from tests.pipeline.extras import Extra, run_extra

MODELS = ("mlp", "mixed", "gpt2")


def cases_for(pp: int) -> list[Case]:
    odd = {2: 3, 3: 5, 4: 7}[pp]
    out = []
    for i, (schedule, m) in enumerate((s, m) for s in SCHEDULES for m in (1, pp, 2 * pp, odd)):
        out.append(Case(schedule, m, MODELS[(i + pp) % 3]))
    out += [
        Case("1f1b", pp + 1, "mlp", layers=9, balance="params", steps=2),  # caches across steps
        Case("zb-h1", pp, "gpt2", layers=6, steps=2),
        Case("interleaved", 2 * pp, "mixed", layers=3 * pp + 1, chunks=3),
    ]
    return out


def _run(rank: int, setting):
    if isinstance(setting, Case):
        return check_against_reference(rank, setting)
    return run_extra(rank, setting)


@pytest.mark.timeout(240)
@pytest.mark.parametrize("pp", [2, 3, 4])
def test_every_schedule_equals_the_whole_model(pp):
    cases = cases_for(pp)
    extras = [Extra("reference_gpt", pp), Extra("eval_and_forward", pp)] if pp != 3 else []
    results = run_grid(_run, cases + extras, pp, timeout=220)
    for case, ranks in zip(cases, results):
        losses = [r["loss"] for r in ranks if r["loss"]]
        assert len(losses) == 1, f"{case}: the loss is on exactly one rank, got {losses}"
        worst = {k: max(r["errors"][k] for r in ranks) for k in ("loss", "grad", "param")}
        assert max(worst.values()) <= 1e-5, f"{case}: {worst}"
