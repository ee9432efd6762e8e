"""How long one collective takes on a group of the cluster, from the profile's
measurements inside a node and the cluster's link between nodes.

Inside a node the profile's AlphaBeta for the group size is used (the nearest measured
size at or below it when that size was not measured). A group that spans nodes is a
ring whose slowest hop is the node's link, shared by every group that crosses it at the
same time: with k of the group's members on each node, per_node / k such groups share
one node's link, so each ring hop gets link * k / per_node. A ring moves
2 (g - 1) / g of the buffer per rank for an all-reduce, (g - 1) / g for a
reduce-scatter or an all-gather, and its latency grows with the nodes it visits.
"""

from __future__ import annotations

from .types import AlphaBeta, Cluster

#: bytes each rank of a ring sends, as a multiple of the buffer, times g / (g - 1)
_RING_FACTOR = {
    "all_reduce": 2.0,
    "reduce_scatter": 1.0,
    "all_gather": 1.0,
    "all_to_all": 1.0,
    "send_recv": 1.0,
}
#: used when a profile has no figure for the op at all (a latency in s, a rate in bytes/s)
FALLBACK = AlphaBeta(latency_s=50e-6, bandwidth=1e9)


def intra_node(cluster: Cluster, op: str, size: int) -> AlphaBeta:
    """The profile's AlphaBeta for `op` on `size` ranks of one node."""
    table = cluster.profile.collectives.get(op) or cluster.profile.collectives.get("all_reduce")
    if not table:
        return FALLBACK
    sizes = sorted(int(g) for g in table)
    below = [g for g in sizes if g <= size]
    return table[str(below[-1] if below else sizes[0])]


def collective_time(cluster: Cluster, op: str, size: int, nbytes: float, stride: int = 1) -> float:
    """Seconds for one `op` of an nbytes buffer on a group of `size` ranks whose members
    are `stride` ranks apart (the layout of knobs.py)."""
    if size <= 1 or nbytes <= 0:
        return 0.0
    per_node = cluster.per_node
    if size * stride <= per_node or cluster.nodes == 1:
        return intra_node(cluster, op, size).time(nbytes)
    link = cluster.inter_node or intra_node(cluster, op, size)
    members_per_node = max(1, per_node // stride)
    nodes_visited = max(2, size // members_per_node)
    share = link.bandwidth * members_per_node / per_node
    moved = nbytes * _RING_FACTOR.get(op, 1.0) * (size - 1) / size
    return link.latency_s * nodes_visited + moved / share


def latency(cluster: Cluster, op: str, size: int, stride: int = 1) -> float:
    """The fixed cost of one more `op` on the group (what a bucketed reduction pays once
    per bucket or chunk on top of collective_time of all its bytes)."""
    if size <= 1:
        return 0.0
    if size * stride <= cluster.per_node or cluster.nodes == 1:
        return intra_node(cluster, op, size).latency_s
    link = cluster.inter_node or intra_node(cluster, op, size)
    return link.latency_s * max(2, size // max(1, cluster.per_node // stride))


def send_recv_time(cluster: Cluster, nbytes: float, across_nodes: bool) -> float:
    """One point-to-point message between pipeline neighbours."""
    if nbytes <= 0:
        return 0.0
    if across_nodes and cluster.nodes > 1 and cluster.inter_node is not None:
        return cluster.inter_node.time(nbytes)
    return intra_node(cluster, "send_recv", 2).time(nbytes)
