"""Gradients after the schedule: parameters tied across stages, and data parallelism.

A parameter used by layers on different pp ranks (GPT-2's LM head is its token
embedding) exists once per rank that holds it; each computes part of its
gradient. TiedParams sums those parts over the ranks that share it (one
megalith_comm group per set of ranks, created when the pipeline is built), so
every copy takes the same optimizer step and the copies stay equal. Then
reduce_dp averages every gradient over the data-parallel group.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

import megalith_comm as comm

from .partition import Partition
from .schedule import Schedule


class TiedParams:
    def __init__(
        self,
        layers: Sequence[nn.Module],
        partition: Partition,
        schedule: Schedule,
        group: comm.ProcessGroup,
        mesh: comm.Mesh | None,
        pp_axis: str,
    ):
        holders: dict[int, tuple[nn.Parameter, set[int]]] = {}
        for s in range(schedule.num_stages):
            for i in partition.layers(s):
                for p in layers[i].parameters():
                    holders.setdefault(id(p), (p, set()))[1].add(schedule.rank_of(s))
        self.ties = [(p, tuple(sorted(r))) for p, r in holders.values() if len(r) > 1]
        self.crosses_ranks = bool(self.ties)
        self._groups: dict[tuple[int, ...], comm.ProcessGroup] = {}
        for ranks in dict.fromkeys(r for _, r in self.ties):  # first-seen order, same everywhere
            made = comm.new_groups(
                _world_partition(ranks, group, mesh, pp_axis), name="pipeline_tied"
            )
            mine = [g for g in made if g is not None]
            if group.rank in ranks:
                self._groups[ranks] = mine[0]
        self._rank = group.rank

    def reduce_grads(self) -> None:
        """Sums each tied parameter's gradient over the ranks that hold it."""
        by_group: dict[tuple[int, ...], list[torch.Tensor]] = {}
        for p, ranks in self.ties:
            if self._rank not in ranks:
                continue
            if p.grad is None:  # unused here: its share is zero, but the sum must still run
                p.grad = torch.zeros_like(p)
            by_group.setdefault(ranks, []).append(p.grad)
        for ranks, grads in by_group.items():
            comm.all_reduce_coalesced(grads, op="sum", group=self._groups[ranks])


def _world_partition(
    ranks: tuple[int, ...], group: comm.ProcessGroup, mesh: comm.Mesh | None, pp_axis: str
) -> list[list[int]]:
    """For each pipeline replica, the global ranks at pp coordinates `ranks`."""
    if mesh is None:
        world = group.world.world_size
        if group.size != world:
            raise ValueError(
                f"pipeline: parameters tied across stages need the pp group to be the world "
                f"({group.size} of {world} ranks) or a mesh (Pipeline(mesh=...)), so that every "
                "rank can create the groups that sum their gradients"
            )
        return [[group.global_rank(r) for r in ranks]]
    others = [name for name in mesh.names if name != pp_axis]
    out = []
    for line in mesh.shape.partition([pp_axis]):  # one pipeline replica per line
        coords = mesh.shape.coords(line[0])
        base = {name: coords[name] for name in others}
        out.append([mesh.shape.rank_of({**base, pp_axis: r}) for r in ranks])
    return out


def reduce_dp(module: nn.Module, group: comm.ProcessGroup) -> None:
    """Averages every gradient of module over the data-parallel group."""
    grads = [p.grad for p in module.parameters() if p.grad is not None]
    if grads:
        comm.all_reduce_coalesced(grads, op="avg", group=group)
