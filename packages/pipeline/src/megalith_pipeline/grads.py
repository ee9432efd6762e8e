"""Gradients after the schedule: parameters tied across stages, and data parallelism.

A parameter used by layers on different pp ranks (GPT-2's LM head is its token
embedding) exists once per rank that holds it; each computes part of its
gradient. TiedParams sums those parts over the ranks that share it (one
megalith_comm group per set of ranks, created when the pipeline is built), so
every copy takes the same optimizer step and the copies stay equal. Then
reduce_dp averages every gradient over the data-parallel group.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import nn

import megalith_comm as comm

from .partition import Partition
from .schedule import Schedule

#: a data-parallel wrapper's views of the given parameters' reduced gradients
ReducedGrads = Callable[[list[nn.Parameter]], Sequence[torch.Tensor]]


class TiedParams:
    """Parameters whose gradients are summed over the stages that use them.

    A tie is one Parameter object used by layers on several ranks, or objects the
    model declares tied (`extra`: a copy materialised apart on another stage).
    Members are kept as (layer index, parameter name) and looked up at each step,
    so a stage materialised after the pipeline was built (to_empty) is still found.
    """

    def __init__(
        self,
        layers: Sequence[nn.Module],
        partition: Partition,
        schedule: Schedule,
        group: comm.ProcessGroup,
        mesh: comm.Mesh | None,
        pp_axis: str,
        extra: Sequence[tuple[nn.Parameter, nn.Parameter]] = (),
    ):
        self._layers = layers
        self._rank = group.rank
        where: dict[int, list[tuple[int, str]]] = {}  # id(param) -> (layer, name) uses
        ranks: dict[int, set[int]] = {}  # id(param) -> pp ranks whose stages use it
        for s in range(schedule.num_stages):
            for i in partition.layers(s):
                for name, p in layers[i].named_parameters():
                    where.setdefault(id(p), []).append((i, name))
                    ranks.setdefault(id(p), set()).add(schedule.rank_of(s))
        root = {k: k for k in where}

        def find(k: int) -> int:
            while root[k] != k:
                k = root[k]
            return k

        for a, b in extra:
            if id(a) in root and id(b) in root:
                root[find(id(a))] = find(id(b))
        members: dict[int, list[int]] = {}
        for k in where:  # first-seen order: the same on every rank
            members.setdefault(find(k), []).append(k)
        local_layers = {i for s in schedule.stages_of(group.rank) for i in partition.layers(s)}
        # (ranks holding the tie, its uses in this rank's layers)
        self.ties: list[tuple[tuple[int, ...], list[tuple[int, str]]]] = []
        for keys in members.values():
            holders = tuple(sorted(set().union(*(ranks[k] for k in keys))))
            uses = [u for k in keys for u in where[k] if u[0] in local_layers]
            if len(holders) > 1 or len({k for k in keys if group.rank in ranks[k]}) > 1:
                self.ties.append((holders, uses))
        self.crosses_ranks = any(len(h) > 1 for h, _ in self.ties)
        self._groups: dict[tuple[int, ...], comm.ProcessGroup] = {}
        for holders in dict.fromkeys(h for h, _ in self.ties if len(h) > 1):
            made = comm.new_groups(
                _world_partition(holders, group, mesh, pp_axis), name="pipeline_tied"
            )
            if group.rank in holders:
                self._groups[holders] = next(g for g in made if g is not None)

    def _local(self, uses: list[tuple[int, str]]) -> list[nn.Parameter]:
        found: dict[int, nn.Parameter] = {}
        for i, name in uses:
            p = self._layers[i].get_parameter(name)
            found.setdefault(id(p), p)
        return list(found.values())

    def secondary_copies(self) -> list[nn.Parameter]:
        """This rank's parameters of ties whose lowest holding rank is another one: what
        to skip to count every tied weight once (a norm over all stages, say)."""
        return [
            p
            for holders, uses in self.ties
            if len(holders) > 1 and self._rank != min(holders)
            for p in self._local(uses)
        ]

    def reduce_grads(self, reduced: ReducedGrads | None = None) -> None:
        """Gives every copy of a tied parameter the sum of all copies' gradients: on .grad,
        or where `reduced` says a data-parallel wrapper keeps them after its reduction
        (ZeroOptimizer.reduced_grads: summing over stages commutes with its dp average)."""
        sums: list[tuple[torch.Tensor, list[nn.Parameter], list[torch.Tensor] | None]] = []
        by_group: dict[tuple[int, ...], list[torch.Tensor]] = {}
        for holders, uses in self.ties:
            local = self._local(uses)
            if not local or not any(p.requires_grad for p in local):
                continue  # frozen (LoRA's base weights), alike on every holder: no gradient
            views = list(reduced(local)) if reduced is not None else None
            grads = views if views is not None else [p.grad for p in local if p.grad is not None]
            # Unused here: the share is zero, but the sum over the ranks must still run.
            total = torch.zeros_like(local[0]) if not grads else sum(grads[1:], grads[0].clone())
            sums.append((total, local, views))
            if len(holders) > 1:
                by_group.setdefault(holders, []).append(total)
        for holders, grads in by_group.items():
            comm.all_reduce_coalesced(grads, op="sum", group=self._groups[holders])
        for total, local, views in sums:
            if views is not None:
                for view in views:
                    view.copy_(total)
                continue
            for p in local:
                p.grad = total if len(local) == 1 else total.clone()


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
