"""Peak memory per rank of a plan: model state, activations, and the allocator's slack.

Model state follows megalith_zero.estimate's accounting (resident_state): working
parameters and gradients, the largest chunk's gradients in flight (stages 2, 3), the
largest gathered chunk (stage 3; at stages 2-3 every chunk's whole gradient while
micro-batches accumulate), fp32 masters (mixed precision) and Adam's two states,
the sharded parts divided by dp, on the rank's own parameters (its pipeline stages,
tensor-parallel weights divided by tp). Where megalith trains over fp32 parameters under
torch.autocast (DDP, and any pipeline: Strategy.zero_config) the working dtype is fp32
and autocast keeps a bf16 copy of each weight through the step. For a dp-only ZeRO plan
with the model at hand, megalith_zero.estimate itself gives the model state (exact).

Gradients that torch allocates during backward (stage 0, one micro-batch) take the
place of the activations backward frees: the peak holds the larger of the two.

Activations: a block keeps activation_bytes per sequence (a checkpointed one only its
boundary_bytes, plus one block's worth while it is recomputed), for the micro-batches a
schedule keeps in flight (stages.peak_activations: a split backward holds a micro-batch's whole
activations from I, which recomputes them, to W); tp shards TP_SHARDED_ACTIVATIONS of them,
sp divides all of the layers' (the embedding and the head run on the whole sequence). Slack: ALLOCATOR_SLACK of the total and a fixed baseline per device
kind (BASELINE_BYTES) for what is not tensors.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from . import exact_state, stages
from .knobs import Knobs
from .types import BlockCost, Cluster, ModelAnalysis

DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}
#: fp32 bytes per parameter of Adam's two states (exp_avg, exp_avg_sq)
ADAM_STATE_BYTES = 8
#: fp32 master copy of a mixed-precision parameter
MASTER_BYTES = 4
#: the share of a block's saved activations that tp shards (the projections' inputs and
#: outputs inside attention and the MLP); norms' inputs and the residual stream stay whole
TP_SHARDED_ACTIVATIONS = 0.8
#: a split backward (ZB-H1, ZB-V): the output gradients its W frontier nodes (the
#: projections) keep from I to W, as a share of a block's saved activations: a GPT
#: block's projection outputs, 9 h of Megatron's 34 h per token (qkv 3 h, attention
#: output h, MLP 4 h and h); checked against 2026-12-03_cpu2_grid_zbv.md
SPLIT_GRAD_SHARE = 9 / 34
#: of a checkpointed block's recomputed activations, what W still unpacks after I (the
#: projections' inputs, for their weight gradients: 7 h of 34 h; I frees the rest)
SPLIT_RECOMPUTED_SHARE = 7 / 34
#: ZeRO's reduce bucket at stages 1-2 (Strategy's default chunk, ColossalAI's 12 MiB)
ZERO_BUCKET_BYTES = 12 << 20
#: the caching allocator's fragmentation and the temporaries of the largest op (a guess:
#: CPU ranks have no caching allocator and the CPU grid's peaks are within 10% with it,
#: so it was left as is; not fitted on CUDA until the H200 grid is recorded)
ALLOCATOR_SLACK = 0.08
#: not-tensor memory per rank: on CUDA the cuBLAS / NCCL workspaces inside the allocator;
#: on CPU ranks a process's resident set with torch and megalith imported
BASELINE_BYTES = {"cuda": 384 << 20, "cpu": 420 << 20}


@dataclass(frozen=True)
class Memory:
    """Bytes per rank, on the busiest rank (the largest total), by kind; host: off-device."""

    params: int
    grads: int
    grads_in_flight: int
    gathered: int
    optimizer: int
    activations: int
    slack: int
    host: int = 0
    #: bytes counted above that are never live at once: with one micro-batch, gradients
    #: torch allocates in backward (ZeRO stage 0) replace the activations backward frees,
    #: so the peak holds the larger of the two, not their sum
    never_together: int = 0

    @property
    def device(self) -> int:
        return (
            self.params
            + self.grads
            + self.grads_in_flight
            + self.gathered
            + self.optimizer
            + self.activations
            + self.slack
            - self.never_together
        )


def working_bytes(knobs: Knobs) -> int:
    """Bytes of a working parameter: fp32 under autocast (DDP, pipelines), else the precision's."""
    if knobs.zero_stage == 0 or knobs.pp > 1:
        return 4
    return DTYPE_BYTES[knobs.precision]


def rank_params(blocks: list[BlockCost], tp: int) -> tuple[int, int]:
    """(parameters a rank of the tp group holds, of them its largest block's)."""
    per_block = [b.params - b.tp_params + b.tp_params // tp for b in blocks]
    return sum(per_block), max(per_block, default=0)


def model_state(n: int, largest: int, knobs: Knobs) -> tuple[int, int, int, int, int, int]:
    """(params, grads, grads in flight, gathered, device optimizer, host optimizer) bytes."""
    wd = working_bytes(knobs)
    dp, stage = knobs.dp, knobs.zero_stage
    mixed = wd < 4
    states = ADAM_STATE_BYTES + (MASTER_BYTES if mixed else 0)
    shard = -(-n // dp) if stage >= 1 else n
    chunk = largest if stage == 3 else min(n, ZERO_BUCKET_BYTES // wd)
    params = shard * wd if stage == 3 else n * wd
    grads = n * wd if stage <= 1 else shard * wd
    in_flight = chunk * wd if stage >= 2 else 0
    gathered = largest * wd if stage == 3 else 0
    host = int(shard * states * knobs.offload_fraction)
    optimizer = shard * states - host
    if wd == 4 and knobs.precision != "fp32":
        params += n * DTYPE_BYTES[knobs.precision]  # autocast's cached low-precision weights
    return params, grads, in_flight, gathered, optimizer, host


def block_activation(
    block: BlockCost, knobs: Knobs, checkpointed: bool, scale: float, layer: bool = True
) -> float:
    """Bytes one block keeps for backward per micro-batch; layer: one of the repeated
    layers, whose sequence sp splits (not the embedding or the head)."""
    b = knobs.micro_batch / (knobs.sp if layer else 1)
    if checkpointed:
        return block.boundary_bytes * b * scale
    kept = TP_SHARDED_ACTIVATIONS / knobs.tp + (1 - TP_SHARDED_ACTIVATIONS)
    return block.activation_bytes * b * kept * scale


def stage_activations(
    blocks: list[BlockCost], layers: list[BlockCost], knobs: Knobs, scale: float
) -> tuple[float, float]:
    """(one micro-batch's kept activations of a virtual stage, its largest recompute);
    layers: its repeated layers (the ones checkpointing applies to)."""
    n_ckpt = round(knobs.ckpt * len(layers))
    ckpt = {id(b) for b in layers[:n_ckpt]}
    mine = {id(b) for b in layers}
    kept = sum(block_activation(b, knobs, id(b) in ckpt, scale, id(b) in mine) for b in blocks)
    recompute = max((block_activation(b, knobs, False, scale) for b in layers[:n_ckpt]), default=0)
    return kept, recompute


def split_held(
    blocks: list[BlockCost], layers: list[BlockCost], knobs: Knobs, scale: float
) -> float:
    """Bytes one micro-batch of a virtual stage holds from its I pass to its W pass under
    a split backward ([Note: splitting backward] in megalith_pipeline.backward_split):
    I runs with retain_graph, so a block's saved activations stay for W, and the output
    gradients saved at each W frontier node (SPLIT_GRAD_SHARE of them) join them; a
    checkpointed block's recompute in I leaves only what W still unpacks
    (SPLIT_RECOMPUTED_SHARE), beside its kept input. layers: as in stage_activations."""
    ckpt = {id(b) for b in layers[: round(knobs.ckpt * len(layers))]}
    mine = {id(b) for b in layers}
    out = 0.0
    for b in blocks:
        whole = block_activation(b, knobs, False, scale, id(b) in mine)
        if id(b) in ckpt:
            kept = block_activation(b, knobs, True, scale)
            out += kept + whole * (SPLIT_RECOMPUTED_SHARE + SPLIT_GRAD_SHARE)
        else:
            out += whole * (1 + SPLIT_GRAD_SHARE)
    return out


def peak_memory(
    analysis: ModelAnalysis, cluster: Cluster, knobs: Knobs, model: Any = None
) -> Memory:
    """The busiest rank's memory under `knobs` (see the module's docstring); with the
    model (meta is enough), a dp-only ZeRO plan's model state is megalith_zero's estimate."""
    vstages = stages.virtual_stages(analysis, knobs.pp * knobs.chunks)
    where = stages.placement(knobs)
    scale = DTYPE_BYTES[knobs.precision] / DTYPE_BYTES.get(analysis.param_dtype, 2)
    ends = (analysis.pre, analysis.post)
    layers = [[b for b in blocks if all(b is not e for e in ends)] for blocks in vstages]
    acts = [stage_activations(bs, ls, knobs, scale) for bs, ls in zip(vstages, layers)]
    held = tuple(split_held(bs, ls, knobs, scale) for bs, ls in zip(vstages, layers))
    baseline = BASELINE_BYTES.get(cluster.profile.device, BASELINE_BYTES["cuda"])
    best: Memory | None = None
    for rank in range(knobs.pp):
        mine = [s for s, r in enumerate(where) if r == rank]
        blocks = [b for s in mine for b in vstages[s]]
        n, largest = rank_params(blocks, knobs.tp)
        if model is not None and exact_state.applies(knobs):
            p, g, f, q, opt, host = exact_state.model_state(model, knobs)
        else:
            p, g, f, q, opt, host = model_state(n, largest, knobs)
        if knobs.zero_stage >= 2 and knobs.num_microbatches > 1:
            # accumulating micro-batches keeps every chunk's whole gradient until the step
            # reduces them (megalith_zero's no_sync, and ZeRO-2 under a pipeline)
            f = max(f, n * working_bytes(knobs))
        if knobs.pp > 1:
            kept = tuple(a for a, _ in acts)
            act = stages.peak_activations(
                knobs.schedule, knobs.pp, knobs.num_microbatches, rank, kept, held
            )
        else:
            act = acts[0][0]
        act += max((acts[s][1] for s in mine), default=0)
        apart = 0
        if knobs.zero_stage == 0 and knobs.num_microbatches == 1 and knobs.pp == 1:
            apart = int(min(g, act))
        tensors = p + g + f + q + opt + act - apart
        slack = int(tensors * ALLOCATOR_SLACK) + baseline
        m = Memory(p, g, f, q, opt, int(act), slack, host, apart)
        if best is None or m.device > best.device:
            best = m
    if best is None:
        raise ValueError(
            "peak memory: the plan places no stage on any rank; check pp and the layer split"
        )
    return best
