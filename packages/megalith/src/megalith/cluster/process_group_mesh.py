"""ProcessGroupMesh: the world's ranks on an N-d grid, with a group along any axes.

    pg_mesh = ProcessGroupMesh(dp_size, pp_size, tp_size)
    tp_group = pg_mesh.get_group_along_axis(2)      # the ranks that differ only in tp
    dp_rank = pg_mesh.coordinate(0)

Ranks are laid out row-major (the last axis varies fastest: ColossalAI's and
numpy's order). The groups are megalith_comm ProcessGroups (Gloo for CPU tensors,
NCCL for CUDA ones, so `backend` needs no choosing), which megalith's collectives,
plugins and DistCoordinator take. Creating a group is collective: every rank of
the world calls create_group_along_axis / get_group_along_axis with the same axes
and indices, in the same order (torch.distributed.new_group's rule).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from typing import Any

from . import groups


def prod(nums: Sequence[int]) -> int:
    return math.prod(nums)


def _axes(axis: int | Sequence[int], indices: Any) -> tuple[list[int], list[list[int]] | None]:
    """axis and indices_at_axis in their list-of-axes form."""
    if isinstance(axis, int):
        if indices is not None and not all(isinstance(i, int) for i in indices):
            raise TypeError(
                f"indices_at_axis for the single axis {axis} must be a list of ints, got {indices}"
            )
        return [axis], None if indices is None else [list(indices)]
    return list(axis), None if indices is None else [list(i) for i in indices]


class ProcessGroupMesh:
    """A mesh of the world's ranks with shape `size` (its product must be the world size)."""

    def __init__(self, *size: int) -> None:
        groups.require_world("ProcessGroupMesh")
        world_size = groups.size_of(None)
        if not size or any(not isinstance(s, int) or s < 1 for s in size):
            raise ValueError(f"ProcessGroupMesh{size}: sizes must be integers >= 1")
        if prod(size) != world_size:
            raise ValueError(
                f"ProcessGroupMesh{size}: {' * '.join(map(str, size))} = {prod(size)} != world "
                f"size {world_size}; the sizes must multiply to the number of ranks"
            )
        self._shape = tuple(size)
        self._rank = groups.rank_in(None)
        self._coord = ProcessGroupMesh.unravel(self._rank, self._shape)
        self._ranks_to_group: dict[tuple[int, ...], Any] = {}

    @property
    def shape(self) -> tuple[int, ...]:
        return self._shape

    @property
    def rank(self) -> int:
        return self._rank

    def size(self, dim: int | None = None) -> int | tuple[int, ...]:
        """The mesh's shape, or its size along dim."""
        return self._shape if dim is None else self._shape[dim]

    def coordinate(self, dim: int | None = None) -> int | tuple[int, ...]:
        """This rank's coordinates, or its coordinate along dim."""
        return self._coord if dim is None else self._coord[dim]

    @staticmethod
    def unravel(rank: int, shape: tuple[int, ...]) -> tuple[int, ...]:
        """The coordinates of a rank (row-major)."""
        if not 0 <= rank < prod(shape):
            raise ValueError(f"rank {rank} is outside a mesh of shape {shape}")
        coord = []
        for s in reversed(shape):
            rank, c = divmod(rank, s)
            coord.append(c)
        return tuple(reversed(coord))

    @staticmethod
    def ravel(coord: tuple[int, ...], shape: tuple[int, ...], mode: str = "raise") -> int:
        """The rank at coord. mode: "raise" (out of range is an error), "wrap" (modulo the
        size) or "clip" (to the nearest edge), as numpy.ravel_multi_index."""
        if mode not in ("raise", "wrap", "clip"):
            raise ValueError(f"ravel: mode={mode!r}; expected 'raise', 'wrap' or 'clip'")
        if len(coord) != len(shape):
            raise ValueError(f"ravel: coordinate {tuple(coord)} does not match shape {shape}")
        rank = 0
        for c, s in zip(coord, shape):
            c = int(c)
            if mode == "wrap":
                c %= s
            elif mode == "clip":
                c = min(max(c, 0), s - 1)
            elif not 0 <= c < s:
                raise ValueError(f"ravel: coordinate {tuple(coord)} is outside shape {shape}")
            rank = rank * s + c
        return rank

    @staticmethod
    def get_coords_along_axis(
        base_coord: tuple[int, ...], axis: int | list[int], indices_at_axis: list
    ) -> list[tuple[int, ...]]:
        """base_coord with its coordinate along each axis replaced by each of that axis's
        indices (every combination, the last axis fastest)."""
        axes, indices = _axes(axis, indices_at_axis)
        coords = [tuple(base_coord)]
        for ax, idx in zip(axes, indices or []):
            coords = [(*c[:ax], i, *c[ax + 1 :]) for c in coords for i in idx]
        return coords

    def _full_indices(self, axes: list[int], indices: list[list[int]] | None) -> list[list[int]]:
        for ax in axes:
            if not 0 <= ax < len(self._shape):
                raise ValueError(f"axis {ax} is outside a mesh of {len(self._shape)} dimensions")
        return indices if indices is not None else [list(range(self._shape[ax])) for ax in axes]

    def create_group_along_axis(
        self,
        axis: int | list[int],
        indices_at_axis: list | None = None,
        backend: str | None = None,
    ) -> Any:
        """Creates every group along axis (collectively) and returns this rank's (None when
        indices_at_axis leaves this rank out). backend: every megalith group carries Gloo
        for CPU tensors and NCCL for CUDA ones, whatever it says."""
        axes, indices = _axes(axis, indices_at_axis)
        indices = self._full_indices(axes, indices)
        reduced = [1 if d in axes else s for d, s in enumerate(self._shape)]
        partition = []
        for base in itertools.product(*(range(s) for s in reduced)):
            coords = ProcessGroupMesh.get_coords_along_axis(base, axes, indices)
            partition.append(tuple(sorted(ProcessGroupMesh.ravel(c, self._shape) for c in coords)))
        missing = [ranks for ranks in dict.fromkeys(partition) if ranks not in self._ranks_to_group]
        if missing:
            import megalith_comm

            made = megalith_comm.new_groups(missing, f"pg_mesh/axis{'+'.join(map(str, axes))}")
            self._ranks_to_group.update(zip(missing, made))
        mine = [ranks for ranks in partition if self._rank in ranks]
        return self._ranks_to_group[mine[0]] if mine else None

    def get_group_along_axis(
        self,
        axis: int | list[int],
        indices_at_axis: list | None = None,
        backend: str | None = None,
    ) -> Any:
        """This rank's group along axis (one axis or a list), created on first use."""
        axes, indices = _axes(axis, indices_at_axis)
        indices = self._full_indices(axes, indices)
        coords = ProcessGroupMesh.get_coords_along_axis(self._coord, axes, indices)
        ranks = tuple(sorted(ProcessGroupMesh.ravel(c, self._shape) for c in coords))
        if ranks in self._ranks_to_group:
            return self._ranks_to_group[ranks]
        return self.create_group_along_axis(axes, indices, backend)

    def get_ranks_in_group(self, group: Any) -> list[int]:
        """The global ranks of a group this mesh made."""
        for ranks, made in self._ranks_to_group.items():
            if made is group:
                return list(ranks)
        raise ValueError(f"get_ranks_in_group: {group!r} was not made by this ProcessGroupMesh")

    def destroy_mesh_process_groups(self) -> None:
        """Forgets the mesh's groups (megalith_comm closes them when the world is destroyed)."""
        self._ranks_to_group.clear()
