"""Splitting a stage's backward into an input-gradient pass (I) and a weight-gradient pass (W).

[Note: splitting backward]
Zero-bubble schedules run I as soon as the output gradient arrives (the previous
stage waits for it) and W later, in what would be a bubble. No hand-written
graph is needed; the split is found in the autograd graph of each micro-batch:

- A node of the graph "reaches inputs" when some path from it ends at one of the
  stage's input leaves, and "reaches weights" likewise for the parameters.
- I is torch.autograd.grad(outputs, inputs, retain_graph=True): the engine runs
  only nodes that reach inputs, and in each only the outputs on those paths.
- The W frontier is every node that reaches inputs and has an edge into the
  part of the graph that reaches weights only (a Linear's AddmmBackward: one edge
  towards the layer input, the others towards its weight and bias). A pre-hook
  on each frontier node saves the gradient flowing into it during I.
- W runs each frontier node again, alone, for its weight-only edges:
  torch.autograd.backward from the node (a GradientEdge, with the saved gradient)
  with `inputs=` the parameters below those edges. The engine computes only what
  leads to `inputs`, so the node's edge towards the stage inputs is skipped (the
  dW matmul of a Linear runs, its dX does not). One call per node, because a call
  that starts from two frontier nodes would carry the later one's gradient down
  the input path into the earlier one, which already has its own. Outputs that
  reach weights but not inputs are W roots as they are.
So nothing on the input path is computed twice. W accumulates into `.grad`
through AccumulateGrad, so gradient hooks (DDP, ZeRO) fire as in a plain
backward. A stage whose inputs need no gradient (the first) has an empty I and a
W that is the whole backward.

[Note: one W, one reduction] A W pass is many backward calls, and each call's end is a
backward's end for DDP/ZeRO hooks (megalith_zero reduces every chunk there). The step's
last W pass therefore runs every call but its last inside the wrapper's no_sync: the
gradients of all calls accumulate, and the last call's end reduces each chunk once.
Likewise torch.utils.checkpoint recomputes a checkpointed block once per backward call;
the W calls of a micro-batch run as one GraphExecGroup, so the block runs its forward
once in W (once more in I, which is a call of its own).

When some weight-only node has two parents (a weight used twice, directly), the
input path can reach a frontier node's own weight edge, and the per-node call
would count that path again. Such a micro-batch falls back to a W that is a
whole backward restricted to the weights: correct, and as slow as I + B.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager
from typing import Any

import torch
import torch.utils.checkpoint as torch_checkpoint
from torch.autograd.graph import GradientEdge, Node, get_gradient_edge


@contextlib.contextmanager
def _one_recompute() -> Iterator[None]:
    """The W calls of one micro-batch as one group for torch.utils.checkpoint (non-reentrant):
    a checkpointed block is recomputed once for all of them, not once per call. The calls
    run over disjoint parts of the graph (each node in one call), as GraphExecGroup asks.
    Inside a caller's own group (groups do not nest) the calls join that one."""
    group = getattr(torch_checkpoint, "GraphExecGroup", None)
    if group is None or group._get_current_group() is not None:
        yield
        return
    with group():
        yield


def _walk(
    roots: Sequence[Node], inputs: set[Node], weights: set[Node]
) -> tuple[dict[Node, tuple[bool, bool]], dict[Node, int]]:
    """(reaches inputs, reaches weights) for every node below roots, and each node's
    number of parent edges (iterative DFS; graphs can be deep)."""
    reach: dict[Node, tuple[bool, bool]] = {}
    parents: dict[Node, int] = {}
    stack: list[tuple[Node, bool]] = [(r, False) for r in roots]
    while stack:
        node, expanded = stack.pop()
        if node in reach:
            continue
        children = [c for c, _ in node.next_functions if c is not None]
        if not expanded:
            stack.append((node, True))
            for c in children:
                parents[c] = parents.get(c, 0) + 1
                if c not in reach:
                    stack.append((c, False))
            continue
        r_in, r_w = node in inputs, node in weights
        for c in children:
            c_in, c_w = reach[c]
            r_in, r_w = r_in or c_in, r_w or c_w
        reach[node] = (r_in, r_w)
    return reach, parents


class WeightPass:
    """The deferred W pass of one micro-batch on one stage: backward calls, each from
    some roots (tensors or GradientEdges) with their gradients, into some weights."""

    def __init__(self, calls: list[tuple[list[Any], list[torch.Tensor], list[torch.Tensor]]]):
        self._calls = calls

    def run(self, no_sync: Callable[[], AbstractContextManager] | None = None) -> None:
        """Runs the calls. no_sync: the data-parallel wrapper's (ZeroOptimizer.no_sync),
        for the step's last W pass: every call but the last runs inside it, so the
        wrapper's end-of-backward reduction runs once ([Note: one W, one reduction])."""
        calls = [c for c in self._calls if c[0] and c[2]]
        self._calls = []
        with _one_recompute():
            for k, (roots, grads, weights) in enumerate(calls):
                defer = no_sync is not None and k < len(calls) - 1
                with no_sync() if defer else contextlib.nullcontext():
                    torch.autograd.backward(roots, grads, inputs=weights)


def _weights_below(
    node: Node, weight_only: set[Node], params: dict[Node, torch.Tensor]
) -> list[torch.Tensor]:
    """The parameters reached from node's weight-only edges."""
    found, seen = [], set()
    stack = [c for c, _ in node.next_functions if c in weight_only]
    while stack:
        n = stack.pop()
        if n in seen:
            continue
        seen.add(n)
        if n in params:
            found.append(params[n])
        stack.extend(c for c, _ in n.next_functions if c in weight_only)
    return found


def input_pass(
    outputs: Sequence[torch.Tensor],
    grads: Sequence[torch.Tensor | None],
    inputs: Sequence[torch.Tensor],
    weights: Sequence[torch.Tensor],
) -> tuple[list[torch.Tensor], WeightPass]:
    """Runs I: the gradients of `inputs` (zeros where unused), and the W pass to run later.

    outputs/grads: what backward would start from (grad None for a scalar loss).
    inputs: the stage's input leaves that require grad. weights: its parameters.
    """
    grads = [torch.ones_like(o) if g is None else g for o, g in zip(outputs, grads)]
    weights = [w for w in weights if w.requires_grad]
    if not inputs:  # nothing to send back: W is the whole backward
        return [], WeightPass([(list(outputs), grads, weights)])
    input_nodes = {get_gradient_edge(x).node for x in inputs}
    params = {get_gradient_edge(w).node: w for w in weights}
    weight_nodes = set(params)
    root_nodes = [get_gradient_edge(o).node for o in outputs]
    reach, parents = _walk(root_nodes, input_nodes, weight_nodes)
    weight_only = {n for n, r in reach.items() if r == (False, True)}
    shared = any(parents.get(n, 0) > 1 for n in weight_only)

    frontier = (
        []
        if shared
        else [
            n
            for n, (r_in, _) in reach.items()
            if r_in and any(c in weight_only for c, _ in n.next_functions)
        ]
    )
    saved: dict[Node, tuple[torch.Tensor | None, ...]] = {}

    def saver(node: Node):
        def hook(grad_outputs: tuple[torch.Tensor | None, ...]) -> None:
            saved[node] = grad_outputs

        return hook

    hooks = [n.register_prehook(saver(n)) for n in frontier]
    in_roots = [(o, g) for o, g, n in zip(outputs, grads, root_nodes) if reach[n][0]]
    try:
        found = torch.autograd.grad(
            [o for o, _ in in_roots],
            list(inputs),
            [g for _, g in in_roots],
            retain_graph=True,
            allow_unused=True,
        )
    finally:
        for h in hooks:
            h.remove()
    input_grads = [torch.zeros_like(x) if g is None else g for x, g in zip(inputs, found)]
    if shared:
        return input_grads, WeightPass([(list(outputs), grads, weights)])

    calls = []
    for node in frontier:
        into = [
            (GradientEdge(node, i), g) for i, g in enumerate(saved.get(node, ())) if g is not None
        ]
        below = _weights_below(node, weight_only, params)
        if into and below:
            calls.append(([e for e, _ in into], [g for _, g in into], below))
    roots = [(o, g) for o, g, n in zip(outputs, grads, root_nodes) if n in weight_only]
    if roots:
        calls.append(([o for o, _ in roots], [g for _, g in roots], weights))
    return input_grads, WeightPass(calls)
