"""Mesh: the world's ranks laid out on named axes (dp, pp, tp, ...), with a group per axis set.

    mesh = Mesh(world, dp=2, pp=2, tp=2, order=("pp", "dp", "tp"))
    mesh.coords          # {"pp": 0, "dp": 1, "tp": 1} on rank 3
    mesh.group("dp")     # the ranks that differ only in dp
    mesh.group(("dp", "tp"))

Ranks are laid out row-major in `order`: the last axis varies fastest (here tp, so
a tensor-parallel group is adjacent ranks). The shape is checked against the world
size on every rank before any communication. Construction is collective: every
rank creates the groups of every non-empty set of axes, in one fixed order, so all
ranks call torch.distributed.new_group identically (sets whose rank partition equals
an earlier one, because of axes of size 1, reuse that one's groups).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from .group import ProcessGroup, new_groups


@dataclass(frozen=True)
class MeshShape:
    """Axis names and sizes, outermost first. Validates itself on construction."""

    axes: tuple[tuple[str, int], ...]

    def __post_init__(self) -> None:
        if not self.axes:
            raise ValueError("a mesh needs at least one axis, e.g. Mesh(dp=4)")
        names = [name for name, _ in self.axes]
        if len(set(names)) != len(names):
            raise ValueError(f"mesh axis names must be distinct, got {names}")
        for name, size in self.axes:
            if not isinstance(name, str) or not name.isidentifier():
                raise ValueError(f"mesh axis name {name!r} is not an identifier")
            if not isinstance(size, int) or isinstance(size, bool) or size < 1:
                raise ValueError(f"mesh axis {name}={size!r}: sizes must be integers >= 1")

    @classmethod
    def of(cls, sizes: Mapping[str, int], order: Iterable[str] | None = None) -> MeshShape:
        """From {axis: size}; `order` (outermost first) must name every axis exactly once."""
        if order is None:
            return cls(tuple(sizes.items()))
        order = tuple(order)
        if sorted(order) != sorted(sizes):
            raise ValueError(
                f"mesh order {list(order)} must name each axis exactly once; axes: {list(sizes)}"
            )
        return cls(tuple((name, sizes[name]) for name in order))

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.axes)

    @property
    def sizes(self) -> dict[str, int]:
        return dict(self.axes)

    @property
    def numel(self) -> int:
        return math.prod(size for _, size in self.axes)

    def __str__(self) -> str:
        return " * ".join(f"{name}({size})" for name, size in self.axes)

    def check(self, world_size: int) -> None:
        """ValueError with all the numbers unless the sizes multiply to world_size."""
        if self.numel != world_size:
            raise ValueError(
                f"mesh {self} = {self.numel} != world size {world_size}: the axis sizes must "
                f"multiply to the number of ranks"
            )

    def coords(self, rank: int) -> dict[str, int]:
        """The coordinates of a global rank (row-major, last axis fastest)."""
        out = {}
        for name, size in reversed(self.axes):
            rank, out[name] = divmod(rank, size)
        return {name: out[name] for name in self.names}

    def rank_of(self, coords: Mapping[str, int]) -> int:
        rank = 0
        for name, size in self.axes:
            c = coords[name]
            if not 0 <= c < size:
                raise ValueError(f"mesh coordinate {name}={c} is outside [0, {size})")
            rank = rank * size + c
        return rank

    def partition(self, axes: Iterable[str]) -> list[tuple[int, ...]]:
        """The groups of ranks that differ only along `axes`, ordered by the other coordinates."""
        axes = set(axes)
        fixed = [n for n in self.names if n not in axes]
        free = [n for n in self.names if n in axes]
        sizes = self.sizes
        out = []
        for fixed_coords in itertools.product(*(range(sizes[n]) for n in fixed)):
            base = dict(zip(fixed, fixed_coords))
            members = [
                self.rank_of({**base, **dict(zip(free, free_coords))})
                for free_coords in itertools.product(*(range(sizes[n]) for n in free))
            ]
            out.append(tuple(sorted(members)))
        return out


class Mesh:
    """A MeshShape placed on a world, with this rank's coordinates and groups.

    Mesh(world, dp=2, tp=2), Mesh(world, {"dp": 2, "tp": 2}, order=("tp", "dp")).
    `world` is a megalith_comm World (None: the initialized one); only its rank and
    world_size are read before the shape is validated.
    """

    def __init__(
        self,
        world: Any = None,
        sizes: Mapping[str, int] | None = None,
        *,
        order: Iterable[str] | None = None,
        name: str = "mesh",
        **axes: int,
    ):
        if sizes is not None and axes:
            raise ValueError("give the mesh axes either as a dict or as keywords, not both")
        if world is None:
            from .bootstrap import get_world

            world = get_world()
        self.shape = MeshShape.of(dict(sizes) if sizes is not None else axes, order)
        self.shape.check(world.world_size)  # on every rank, before any communication
        self.world = world
        self.name = name
        self.coords = self.shape.coords(world.rank)
        self._groups: dict[frozenset[str], ProcessGroup] = {}
        self._build_groups()

    def _build_groups(self) -> None:
        names = self.shape.names
        made: dict[tuple[tuple[int, ...], ...], ProcessGroup] = {}
        for k in range(1, len(names) + 1):
            for axes in itertools.combinations(names, k):
                partition = tuple(self.shape.partition(axes))
                if partition not in made:
                    label = f"{self.name}/{'+'.join(axes)}"
                    groups = new_groups(partition, label)
                    made[partition] = next(g for g in groups if g is not None)
                self._groups[frozenset(axes)] = made[partition]

    @property
    def names(self) -> tuple[str, ...]:
        return self.shape.names

    def size(self, axis: str | Iterable[str] | None = None) -> int:
        """The size of an axis (or the product over several; None: all)."""
        if axis is None:
            return self.shape.numel
        axes = (axis,) if isinstance(axis, str) else tuple(axis)
        self._key(axes)
        return math.prod(self.shape.sizes[a] for a in axes)

    def coord(self, axis: str) -> int:
        self._key((axis,))
        return self.coords[axis]

    def group(self, axes: str | Iterable[str]) -> ProcessGroup:
        """This rank's group along one axis ("dp") or a set of axes (("dp", "tp"))."""
        return self._groups[self._key((axes,) if isinstance(axes, str) else tuple(axes))]

    def _key(self, axes: tuple[str, ...]) -> frozenset[str]:
        unknown = [a for a in axes if a not in self.shape.sizes]
        if unknown or not axes:
            raise KeyError(f"mesh has axes {list(self.names)}; no axis {unknown or axes}")
        return frozenset(axes)

    def __repr__(self) -> str:
        return f"Mesh({self.shape}, rank {self.world.rank} at {self.coords})"
