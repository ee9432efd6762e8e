"""megalith_comm.Mesh: shape validation (no communication), coordinates, groups per axis set."""

from __future__ import annotations

import itertools
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist

import megalith_comm as comm
from megalith.testing import run_grid
from megalith_comm import mesh as mesh_module
from megalith_comm.mesh import MeshShape


@pytest.fixture
def no_communication(monkeypatch):
    """A fake world; creating any group (the first communication) fails the test."""

    def forbidden(*args, **kwargs):
        raise AssertionError("the mesh communicated before validating its shape")

    monkeypatch.setattr(mesh_module, "new_groups", forbidden)
    assert not dist.is_initialized()
    return SimpleNamespace(rank=0, world_size=4)


def test_bad_shape_names_every_number_before_any_communication(no_communication):
    with pytest.raises(ValueError, match=r"mesh pp\(2\) \* dp\(3\) \* tp\(1\) = 6 != world size 4"):
        comm.Mesh(no_communication, dp=3, pp=2, tp=1, order=("pp", "dp", "tp"))
    with pytest.raises(ValueError, match=r"mesh dp\(8\) = 8 != world size 4"):
        comm.Mesh(no_communication, {"dp": 8})


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"dp": 0, "tp": 4}, r"mesh axis dp=0: sizes must be integers >= 1"),
        ({"dp": 2.0, "tp": 2}, r"mesh axis dp=2.0: sizes must be integers"),
        ({"dp": 2, "tp": 2, "order": ("dp",)}, r"must name each axis exactly once"),
        ({"dp": 2, "tp": 2, "order": ("dp", "tp", "tp")}, r"must name each axis exactly once"),
        ({}, r"a mesh needs at least one axis"),
    ],
)
def test_bad_settings(no_communication, kwargs, message):
    with pytest.raises(ValueError, match=message):
        comm.Mesh(no_communication, **kwargs)


def test_coords_and_partitions_are_row_major_in_order():
    shape = MeshShape.of({"dp": 2, "tp": 2, "pp": 2}, order=("pp", "dp", "tp"))
    assert str(shape) == "pp(2) * dp(2) * tp(2)"
    assert shape.coords(5) == {"pp": 1, "dp": 0, "tp": 1}
    assert [shape.rank_of(shape.coords(r)) for r in range(8)] == list(range(8))
    assert shape.partition(["tp"]) == [(0, 1), (2, 3), (4, 5), (6, 7)]
    assert shape.partition(["dp"]) == [(0, 2), (1, 3), (4, 6), (5, 7)]
    assert shape.partition(["pp"]) == [(0, 4), (1, 5), (2, 6), (3, 7)]
    assert shape.partition(["dp", "tp"]) == [(0, 1, 2, 3), (4, 5, 6, 7)]
    assert shape.partition(["pp", "dp", "tp"]) == [tuple(range(8))]


def expected_group(sizes: dict, order: tuple, rank: int, axes: tuple) -> tuple[int, ...]:
    """Ranks sharing rank's coordinates on every axis outside `axes` (independent of Mesh)."""
    names = list(order)
    grid = list(itertools.product(*(range(sizes[n]) for n in names)))  # row-major
    mine = grid[rank]
    keep = [i for i, n in enumerate(names) if n not in axes]
    return tuple(r for r, c in enumerate(grid) if all(c[i] == mine[i] for i in keep))


def mesh_checks(rank: int, spec: tuple[dict, tuple]) -> dict:
    sizes, order = spec
    mesh = comm.Mesh(None, sizes, order=order)
    grid = list(itertools.product(*(range(sizes[n]) for n in order)))
    assert mesh.coords == dict(zip(order, grid[rank])), mesh.coords
    for k in range(1, len(order) + 1):
        for axes in itertools.combinations(order, k):
            for spelled in (axes, tuple(reversed(axes))):
                group = mesh.group(spelled[0] if len(spelled) == 1 else spelled)
                want = expected_group(sizes, order, rank, axes)
                assert group.ranks == want, (axes, group.ranks, want)
                assert group.rank == want.index(rank) and group.size == len(want)
            t = torch.tensor([float(rank)])
            comm.all_reduce(t, group=group)
            assert t.item() == sum(want), (axes, t.item(), want)
            out = torch.empty(len(want))
            comm.all_gather(out, torch.tensor([float(rank)]), group=group)
            assert out.tolist() == [float(r) for r in want]
            b = torch.tensor([float(rank)])
            comm.broadcast(b, src=want[-1], group=group)
            assert b.item() == want[-1]
            if group.size == 1:  # identity, without any Gloo group behind it
                assert group.gloo is None
    with pytest.raises(KeyError, match="no axis"):
        mesh.group("zz")
    return mesh.coords


SPECS = [
    ({"dp": 4}, ("dp",)),
    ({"dp": 2, "tp": 2}, ("dp", "tp")),
    ({"dp": 2, "tp": 2}, ("tp", "dp")),
    ({"pp": 2, "dp": 1, "tp": 2}, ("pp", "dp", "tp")),
    ({"pp": 1, "dp": 4, "tp": 1}, ("pp", "dp", "tp")),
    ({"ep": 1, "pp": 4, "tp": 1, "dp": 1}, ("dp", "pp", "ep", "tp")),
]


@pytest.mark.timeout(120)
def test_mesh_groups_on_four_ranks():
    results = run_grid(mesh_checks, SPECS, 4, timeout=100, env={"MEGALITH_COMM_DEBUG": "1"})
    for (sizes, order), coords in zip(SPECS, results):
        assert [tuple(c[n] for n in order) for c in coords] == list(
            itertools.product(*(range(sizes[n]) for n in order))
        )


@pytest.mark.timeout(120)
def test_mesh_three_axes_on_eight_ranks():
    spec = ({"dp": 2, "pp": 2, "tp": 2}, ("pp", "dp", "tp"))
    (coords,) = run_grid(mesh_checks, [spec], 8, timeout=100)
    assert coords[5] == {"pp": 1, "dp": 0, "tp": 1}
