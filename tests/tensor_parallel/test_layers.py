"""Every tensor-parallel layer against plain torch on CPU ranks (tp 2, and tp 2 inside dp 2).

One process group per world size runs every case (run_grid): output, input gradient
and weight gradients within 1e-5 relative, with and without sequence parallelism.
"""

from __future__ import annotations

import itertools

import pytest

from megalith.testing import run_grid
from tests.tensor_parallel.layers import LayerCase, run


def cases(dp: int) -> list[LayerCase]:
    out = [LayerCase("cross_entropy", dp), LayerCase("embedding", dp)]
    out.append(LayerCase("embedding", dp, sp=True))
    for layer, sp, option, transposed in itertools.product(
        ("column", "row"), (False, True), (False, True), (False, True)
    ):
        out.append(LayerCase(layer, dp, sp=sp, option=option, transposed=transposed))
    return out


@pytest.mark.parametrize("world_size", [2, 4])
def test_layers_match_torch(world_size):
    grid = cases(world_size // 2)
    results = run_grid(run, grid, world_size, timeout=120)
    failures = [
        f"{case} rank {rank}: {err}"
        for case, per_rank in zip(grid, results)
        for rank, errs in enumerate(per_rank)
        for err in errs
    ]
    assert not failures, "\n".join(failures)
