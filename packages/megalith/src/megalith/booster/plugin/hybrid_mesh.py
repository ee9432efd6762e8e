"""HybridParallelPlugin's mesh as ColossalAI scripts read it: `pg_mesh`, the per-axis
groups (`dp_group`, `tp_group`, `pp_group`, `sp_group`) and `stage_manager`.

megalith's own mesh is megalith_comm's (`plugin.mesh`, groups its collectives take).
ColossalAI scripts hand the plugin's groups to torch.distributed (`dist.all_reduce(loss,
group=plugin.dp_group)`, `dist.get_world_size(plugin.pp_group)`), so the groups shown
here are torch.distributed ProcessGroups: the Gloo group megalith_comm already made for
each axis, and for an axis of one rank a one-rank torch group, made for every rank at
once when the mesh is built (torch's new_group is collective over the whole world, so it
cannot wait until a script first asks).
"""

from __future__ import annotations

from typing import Any

import torch.distributed as dist

# The axis numbers ColossalAI's plugin gives its mesh (dp_outside=True): dp, pp, tp, sp.
AXES = ("dp", "pp", "tp", "sp")


class ProcessGroupMesh:
    """ColossalAI's ProcessGroupMesh over a megalith_comm Mesh: axis 0 dp, 1 pp, 2 tp,
    3 sp (the plugin's dp_axis, pp_axis, tp_axis, sp_axis)."""

    def __init__(self, mesh: Any, singles: dict[int, Any]) -> None:
        self.mesh = mesh
        self._singles = singles  # global rank -> its one-rank torch group

    def single_group(self) -> Any:
        """This rank's one-rank torch.distributed group."""
        return self._singles[self.rank]

    def _name(self, axis: int | str) -> str:
        if isinstance(axis, str):
            if axis not in AXES:
                raise ValueError(f"pg_mesh: axis {axis!r}; the axes are {AXES}")
            return axis
        if not 0 <= axis < len(AXES):
            raise ValueError(f"pg_mesh: axis {axis}; the axes are 0..3 ({', '.join(AXES)})")
        return AXES[axis]

    def _size(self, name: str) -> int:
        return self.mesh.size(name) if name in self.mesh.names else 1

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self._size(a) for a in AXES)

    @property
    def rank(self) -> int:
        return self.mesh.world.rank

    def size(self, dim: int | None = None) -> int | tuple[int, ...]:
        return self.shape if dim is None else self._size(self._name(dim))

    def coordinate(self, dim: int | None = None) -> int | tuple[int, ...]:
        coords = tuple(self.mesh.coord(a) if a in self.mesh.names else 0 for a in AXES)
        return coords if dim is None else coords[AXES.index(self._name(dim))]

    def ranks_along_axis(self, axis: int | str | tuple) -> tuple[int, ...]:
        """The global ranks of this rank's group along the axis (or axes)."""
        names = [self._name(a) for a in (axis if isinstance(axis, (tuple, list)) else (axis,))]
        names = [n for n in names if n in self.mesh.names and self.mesh.size(n) > 1]
        if not names:
            return (self.rank,)
        return self.mesh.group(tuple(names)).ranks

    def get_group_along_axis(self, axis: int | str | tuple, backend: str | None = None) -> Any:
        """This rank's torch.distributed group along the axis (or a tuple of axes)."""
        names = [self._name(a) for a in (axis if isinstance(axis, (tuple, list)) else (axis,))]
        names = [n for n in names if n in self.mesh.names and self.mesh.size(n) > 1]
        if not names:
            return self._singles[self.rank]
        return self.mesh.group(tuple(names)).gloo

    def create_group_along_axis(self, axis: int | str | tuple, backend: str | None = None) -> Any:
        """The groups exist once the mesh is built; this returns this rank's."""
        return self.get_group_along_axis(axis, backend)

    def get_ranks_in_group(self, group: Any) -> list[int]:
        return list(dist.get_process_group_ranks(group))

    def destroy_mesh_process_groups(self) -> None:
        """megalith_comm.destroy() tears the groups down with the world."""

    @staticmethod
    def unravel(rank: int, shape: tuple[int, ...]) -> tuple[int, ...]:
        coords = []
        for n in reversed(shape):
            coords.append(rank % n)
            rank //= n
        return tuple(reversed(coords))

    @staticmethod
    def ravel(coord: tuple[int, ...], shape: tuple[int, ...], mode: str = "raise") -> int:
        if mode == "wrap":
            coord = tuple(c % n for c, n in zip(coord, shape))
        elif any(not 0 <= c < n for c, n in zip(coord, shape)):
            raise ValueError(f"pg_mesh.ravel: coordinate {coord} outside shape {shape}")
        rank = 0
        for c, n in zip(coord, shape):
            rank = rank * n + c
        return rank


def singleton_groups() -> dict[int, Any]:
    """One one-rank torch group per rank, made collectively (every rank makes them all)."""
    world = dist.get_world_size()
    made = {}
    for r in range(world):
        g = dist.new_group([r]) if world > 1 else dist.group.WORLD
        if r == dist.get_rank():
            made[r] = g
    return made


class PipelineStageManager:
    """ColossalAI's PipelineStageManager, read from megalith_pipeline's schedule.

    stage: this rank's pp coordinate; num_stages: pp_size. Outside a schedule no model
    chunk is current, so with several chunks per rank is_first_stage() / is_last_stage()
    answer for the rank: the first stage is always on pp rank 0, the last (the loss) on
    pp rank pp_size - 1, or on pp rank 0 under ZB-V. ignore_chunk=True asks about the
    device as ColossalAI does (first / last pp rank).
    """

    def __init__(self, mesh: Any, pg_mesh: ProcessGroupMesh, style: str, chunks: int) -> None:
        self.mesh = mesh
        self.pg_mesh = pg_mesh
        self.pipeline_axis = AXES.index("pp")
        self.is_interleave = chunks > 1
        self.use_zbv = style == "zb-v"
        self.num_model_chunks = chunks
        self.model_chunk_id: int | None = None
        self.p2p_group = pg_mesh.get_group_along_axis("pp")
        ranks = mesh.group("pp").ranks
        here = ranks.index(mesh.world.rank)
        self.prev_rank = ranks[(here - 1) % len(ranks)]
        self.next_rank = ranks[(here + 1) % len(ranks)]

    @property
    def num_stages(self) -> int:
        return self.mesh.size("pp")

    @property
    def stage(self) -> int:
        return self.mesh.coord("pp")

    def is_first_stage(self, ignore_chunk: bool = False) -> bool:
        if self.model_chunk_id is not None and self.is_interleave and not ignore_chunk:
            return self.stage == 0 and self.model_chunk_id == 0
        return self.stage == 0

    def is_last_stage(self, ignore_chunk: bool = False) -> bool:
        if ignore_chunk or not self.is_interleave:
            return self.stage == self.num_stages - 1
        if self.model_chunk_id is not None and self.model_chunk_id != self.num_model_chunks - 1:
            return False
        return self.stage == (0 if self.use_zbv else self.num_stages - 1)

    def get_rank(self) -> int:
        return self.mesh.world.rank

    def get_prev_rank(self) -> int:
        return self.prev_rank

    def get_next_rank(self) -> int:
        return self.next_rank

    def get_p2p_process_group(self) -> Any:
        return self.p2p_group

    def switch_model_chunk_id(self, model_chunk_id: int) -> None:
        self.model_chunk_id = model_chunk_id

    def distribute_layers(self, num_layers: int, num_stages: int | None = None) -> list[int]:
        """Layers per stage for num_layers decoder layers (the middle stages take more)."""
        stages = (num_stages or self.num_stages) * self.num_model_chunks
        base, extra = divmod(num_layers, stages)
        sizes = [base] * stages
        start = (stages - extra) // 2
        for i in range(start, start + extra):
            sizes[i] += 1
        return sizes

    def get_stage_index(
        self,
        layers_per_stage: list[int],
        stage: int | None = None,
        num_model_chunks: int | None = None,
    ) -> Any:
        """[start, end) of this stage's layers (one pair per model chunk with several)."""
        stage = self.stage if stage is None else stage
        chunks = self.num_model_chunks if num_model_chunks is None else num_model_chunks
        starts = [0]
        for n in layers_per_stage:
            starts.append(starts[-1] + n)
        pp = self.num_stages
        if self.use_zbv:
            picks = [stage, 2 * pp - stage - 1]
        else:
            picks = [stage + c * pp for c in range(chunks)]
        out = [(starts[s], starts[s + 1]) for s in picks]
        return out[0] if len(out) == 1 else out


__all__ = ["AXES", "PipelineStageManager", "ProcessGroupMesh", "singleton_groups"]
