"""What a split backward's W pass (ZB-V) costs beyond the weight gradients themselves, per
micro-batch on one virtual stage: counted from the traced ops, timed by the profile.

megalith_pipeline (backward_split.py) runs W as one torch.autograd.backward call per W
frontier node: every module on the stage's input path that holds weights (a Linear's
addmm or mm, a layer norm; an embedding's lookup is weights-only, no frontier). So:

- each call pays the profile's `split_backward_call_s` (calibrate_split.py);
- a checkpointed block runs its forward once more in W: the calls of a micro-batch's W
  share one torch.utils.checkpoint GraphExecGroup (megalith_pipeline 6dac7d5; before, each
  call was its own graph task and recomputed the block); I's recompute is not reused.

A stage whose inputs need no gradient (the first) has no I: its W is one whole backward,
which costs nothing extra.
"""

from __future__ import annotations

from .types import BlockCost, MachineProfile

#: the ops whose module is a W frontier node (it has an input edge and weight edges)
FRONTIER_OPS = ("aten.addmm.default", "aten.mm.default", "aten.native_layer_norm.default")


def frontier_nodes(block: BlockCost) -> int:
    """W frontier nodes of one micro-batch of `block`: its modules that ran a weight op
    (the head's tied matmul counts: the head module runs it)."""
    return len({op.module for op in block.ops if op.op in FRONTIER_OPS})


def weight_pass_extra(
    blocks: list[BlockCost],
    forward_s: list[float],
    checkpointed: set[int],
    has_inputs: bool,
    profile: MachineProfile,
) -> float:
    """Seconds W adds on one virtual stage per micro-batch: every frontier node's call,
    and in a checkpointed block (id in `checkpointed`) one forward."""
    if not has_inputs:
        return 0.0
    extra = 0.0
    for block, fwd in zip(blocks, forward_s):
        nodes = frontier_nodes(block)
        extra += nodes * profile.split_backward_call_s
        if id(block) in checkpointed:
            extra += fwd
    return extra
