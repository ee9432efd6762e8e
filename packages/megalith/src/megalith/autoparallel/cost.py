"""predict(): the step time, throughput, MFU and peak memory of one plan.

step = compute of every micro-batch (forward 1x, backward BACKWARD_FACTOR x, the
    checkpointed layers' forward again in backward), with a pipeline's bubble from
    megalith_pipeline's simulator playing the schedule with these pass times
  + tp all-reduces (2 per layer forward, 2 backward, on the tp group); under sp,
    Ulysses' all-to-alls (4 per layer each way, their bytes from the traced attention),
    the span's all-gathers and every layer parameter's gradient all-reduce over sp in
    each backward (sp_costs.py); sp splits only the layers' sequence: the embedding and
    the head run whole on each sp rank
  + pp messages (boundary_bytes per micro-batch each way, inside the simulated passes)
  + under a split backward (ZB-V) what W's per-node calls add (split_costs.py: the
    profile's split_backward_call_s per frontier node, and in checkpointed blocks a
    recompute per frontier node), inside the simulated W passes
  + every pipeline pass's fixed cost (pp > 1): the profile's pipeline_pass_s per pass
    (F, B, I, W of one micro-batch on one stage; stages.passes_per_rank counts them from
    megalith_pipeline's schedule), inside the simulated passes
  + every pass whose input comes from another rank (a forward after a stage on another
    rank, a backward or I before one) waits the profile's pipeline_handoff_s beyond its
    message (ranks that outnumber the cores: calibrate_handoff.py), inside the
    simulated passes; stages.handoffs_per_rank counts them
  + the dp gradient reduction that backward does not hide: max(0, comm - DP_OVERLAP x
    the last micro-batch's backward) (all-reduce at stages 0-1, reduce-scatter at 2-3),
    one collective per bucket or chunk (`reductions`: DDP's and ZeRO's buckets, stage 3's
    chunks), each paying the collective's latency, once per step (under a split backward
    too: megalith_pipeline runs the last W pass's calls but one under no_sync)
  + stage 3's parameter all-gathers (forward and backward of every micro-batch, one per
    chunk), less ZERO3_OVERLAP of the compute they are prefetched under
  + the optimizer step: on the device, masters and states at memory bandwidth
    (ADAM_BYTES_PER_PARAM), then stages 1-2 all-gather the updated parameters; the
    offloaded share on the host (host Adam rate, gradients down and parameters up),
    pipelined under backward as megalith_offload's HostStepper does (step_in_backward),
    all but HOST_TAIL of it hidden when backward is long enough.
"""

from __future__ import annotations

from dataclasses import replace
from functools import lru_cache
from typing import Any

from . import stages
from .collectives import collective_time, latency, send_recv_time
from .compute import BACKWARD_FACTOR, forward_time
from .knobs import Knobs
from .memory import ZERO_BUCKET_BYTES, Memory, peak_memory, working_bytes
from .sp_costs import grad_reduce_s, span_gather_s, ulysses_pass_s
from .split_costs import weight_pass_extra
from .types import BlockCost, Candidate, Cluster, ModelAnalysis

#: Adam's bytes moved per parameter: master, exp_avg, exp_avg_sq read and written (24),
#: the gradient read and the working parameter written
ADAM_BYTES_PER_PARAM = 28
#: the share of the last backward under which the dp reduction hides (its last bucket
#: cannot): NCCL runs on its own stream; Gloo's threads compete with compute for cores.
#: gloo: fitted on the CPU grid's dp-only ZeRO configurations (0: ranks that share the
#: cores hide nothing; benchmarks/results/autoparallel/2026-12-02_cpu_grid.md); nccl: a
#: guess, not fitted until the H200 grid is recorded
DP_OVERLAP = {"nccl": 0.8, "gloo": 0.0}
#: the share of compute stage 3's prefetched all-gathers hide under (fitted with
#: DP_OVERLAP, one value per transport; nccl not fitted)
ZERO3_OVERLAP = {"nccl": 0.8, "gloo": 0.0}
#: seconds each blocking tp (and sp: sp_costs.py) collective waits for its group's slowest
#: member, beyond the collective itself: ranks that share cores (CPU ranks, 4 on 2 cores)
#: meet a partner that is descheduled mid-compute. gloo: fitted on the CPU grid's tp
#: configurations (benchmarks/results/autoparallel/2026-12-02_cpu_grid.md), not refitted
#: for sp (2026-12-04_cpu2_sp_and_handoff.md checks it there); nccl: not fitted (0)
TP_SYNC_S = {"nccl": 0.0, "gloo": 0.004}
#: the part of the host step that stays after backward (its last chunks); a guess, not
#: fitted (the CPU grid's host step is a millisecond; the H200 grid will fit it)
HOST_TAIL = 0.1
#: torch DDP's gradient bucket (TorchDDPPlugin's and HybridParallelPlugin's bucket_cap_mb)
DDP_BUCKET_BYTES = 25 << 20
#: stage 3's chunks (megalith_zero.layout.chunk_numel_for): a model of at most
#: ZERO3_ONE_CHUNK_BYTES is one chunk, a larger one chunks of an eighth of it within
#: ZERO3_CHUNK_RANGE
ZERO3_ONE_CHUNK_BYTES = 32 << 20
ZERO3_CHUNK_RANGE = (1 << 20, 64 << 20)
#: schedules whose backward is split into I and W (megalith_pipeline.backward_split)
SPLIT_SCHEDULES = ("zbv",)
#: stage-time ratios are rounded to this many decimals to share simulations
_SIM_DECIMALS = 2


def predict(
    analysis: ModelAnalysis,
    cluster: Cluster,
    *,
    dp: int = 1,
    tp: int = 1,
    pp: int = 1,
    sp: int = 1,
    zero_stage: int = 0,
    offload: str = "none",
    offload_fraction: float = 0.0,
    micro_batch: int = 1,
    num_microbatches: int = 1,
    ckpt: float = 0.0,
    schedule: str | None = None,
    precision: str = "bf16",
    model: Any = None,
) -> Candidate:
    """The Candidate of one plan (see the module's docstring). schedule None: '1f1b' for
    pp > 1, 'none' otherwise. model: the model analysed (meta is enough), for the exact
    model state of dp-only ZeRO plans (megalith_zero.estimate)."""
    knobs = Knobs(
        dp=dp,
        tp=tp,
        pp=pp,
        sp=sp,
        zero_stage=zero_stage,
        offload=offload,
        offload_fraction=offload_fraction,
        micro_batch=micro_batch,
        num_microbatches=num_microbatches,
        ckpt=ckpt,
        schedule=schedule or ("1f1b" if pp > 1 else "none"),
        precision=precision,
    )
    return score(analysis, cluster, knobs, peak_memory(analysis, cluster, knobs, model))


def score(
    analysis: ModelAnalysis, cluster: Cluster, knobs: Knobs, memory: Memory | None = None
) -> Candidate:
    memory = memory or peak_memory(analysis, cluster, knobs)
    parts = step_parts(analysis, cluster, knobs)
    step = sum(parts.values())
    tokens = knobs.sequences_per_step * analysis.seq_len
    return Candidate(
        **knobs.fields_without_precision(),
        predicted_step_s=step,
        predicted_tokens_per_s=tokens / step,
        predicted_peak_bytes=memory.device,
        predicted_mfu=model_flops(analysis, knobs) / (step * knobs.world * peak_rate(cluster)),
        breakdown=parts,
    )


def model_flops(analysis: ModelAnalysis, knobs: Knobs) -> float:
    """FLOPs of a step's forward and backward, no recompute (MFU's numerator)."""
    return (1 + BACKWARD_FACTOR) * analysis.fwd_flops * knobs.sequences_per_step


def peak_rate(cluster: Cluster) -> float:
    """The profile's peak matmul rate (bf16, else fp32): MFU's denominator per device."""
    rates = cluster.profile.matmul.get("bf16") or cluster.profile.matmul["fp32"]
    return max(rates.values())


def _pass_times(
    blocks: list[BlockCost], layers: set[int], analysis: ModelAnalysis, cluster: Cluster, k: Knobs
) -> tuple[float, float, float, float, float]:
    """(forward, backward, recompute, forward communication, backward communication)
    seconds of one micro-batch on blocks: tp's all-reduces, and under sp Ulysses' costs
    (sp_costs.py). sp splits the sequence of the layers only: the embedding and the head
    run on the whole sequence on every sp rank."""
    prof = cluster.profile
    whole = replace(k, sp=1)
    fwd = [
        forward_time(b, k if id(b) in layers else whole, prof, analysis.seq_len, analysis.hidden)
        for b in blocks
    ]
    ckpt = _checkpointed(blocks, layers, k)
    recompute = sum(f for b, f in zip(blocks, fwd) if id(b) in ckpt)
    comm = 0.0  # a pass's, the same forward and backward
    if k.tp > 1:
        for b in blocks:
            shards = k.sp if id(b) in layers else 1
            nbytes = b.tp_allreduce_bytes * k.micro_batch / shards
            one_pass = 2 * collective_time(cluster, "all_reduce", k.tp, nbytes / 2)
            one_pass += 2 * TP_SYNC_S.get(prof.transport, 0.0)
            comm += one_pass * (1.5 if id(b) in ckpt else 1)
    comm_fwd = comm_bwd = comm
    if k.sp > 1:
        wd, sync = working_bytes(k), TP_SYNC_S.get(prof.transport, 0.0)
        for b in blocks:
            if id(b) in layers:
                a2a = ulysses_pass_s(cluster, b, k, sync)
                grads = grad_reduce_s(cluster, b, k, wd, sync)
                comm_fwd += a2a
                comm_bwd += a2a * (2 if id(b) in ckpt else 1) + grads
        if any(b is analysis.blocks[-1] for b in blocks):  # gathered after the last layer
            comm_fwd += span_gather_s(cluster, analysis.blocks[-1], k, sync)
        if any(b is analysis.blocks[0] for b in blocks):  # the split's gradient, gathered
            comm_bwd += span_gather_s(cluster, analysis.blocks[0], k, sync)
    return sum(fwd), BACKWARD_FACTOR * sum(fwd), recompute, comm_fwd, comm_bwd


def _checkpointed(blocks: list[BlockCost], layers: set[int], k: Knobs) -> set[int]:
    """ids of the checkpointed blocks of a stage: the first ckpt share of its layers."""
    mine = [id(b) for b in blocks if id(b) in layers]
    return set(mine[: round(k.ckpt * len(mine))])


def _weight_pass_extra(
    blocks: list[BlockCost], stage: int, layers: set[int], analysis: ModelAnalysis,
    cluster: Cluster, k: Knobs,
) -> float:  # fmt: skip
    """Seconds a split backward's W adds to one micro-batch of virtual stage `stage`."""
    prof = cluster.profile
    fwd = [forward_time(b, k, prof, analysis.seq_len, analysis.hidden) for b in blocks]
    return weight_pass_extra(blocks, fwd, _checkpointed(blocks, layers, k), stage > 0, prof)


def step_parts(
    analysis: ModelAnalysis, cluster: Cluster, k: Knobs, *, simulate: bool = True
) -> dict[str, float]:
    """Seconds per part of one step (their sum is the step). simulate=False: a lower
    bound without the simulator (a pipeline's least bubble, none for ZB-V)."""
    layers = {id(b) for b in analysis.blocks}
    vstages = stages.virtual_stages(analysis, k.pp * k.chunks)
    timed = [[_tied_head(analysis, b) for b in blocks] for blocks in vstages]
    passes = [_pass_times(blocks, layers, analysis, cluster, k) for blocks in timed]
    m = k.num_microbatches
    share = m / k.pp  # each rank's share of every stage's work, over the step
    parts = {
        "compute": sum(f + b for f, b, _, _, _ in passes) * share,
        "recompute": sum(r for _, _, r, _, _ in passes) * share,
        ("tp_comm" if k.sp == 1 else "tp_sp_comm"): sum(cf + cb for *_, cf, cb in passes) * share,
    }
    extra = [0.0] * len(timed)
    if k.schedule in SPLIT_SCHEDULES:  # W's own calls (and recomputes): split_costs.py
        extra = [
            _weight_pass_extra(blocks, s, layers, analysis, cluster, k)
            for s, blocks in enumerate(timed)
        ]
        parts["split_backward"] = sum(extra) * share
    where = stages.placement(k)
    bwd = [b + r + cb + e for (_, b, r, _, cb), e in zip(passes, extra)]
    last_bwd = max(sum(bwd[s] for s in range(len(where)) if where[s] == r) for r in range(k.pp))
    if k.pp > 1 and not simulate and k.schedule != "zbv":  # the least bubble of 1F1B
        least = min(f + b + r for f, b, r, _, _ in passes)
        parts["pp_bubble_and_p2p"] = (k.pp - 1) / k.chunks * least
    pass_s = cluster.profile.pipeline_pass_s if k.pp > 1 else 0.0
    if pass_s:  # each pass's fixed cost: the busiest rank's passes
        parts["pipeline_passes"] = max(stages.passes_per_rank(k.schedule, k.pp, m)) * pass_s
    handoff = cluster.profile.pipeline_handoff_s if k.pp > 1 else 0.0
    fwd_in, bwd_in = stages.handoffs(where)
    if handoff:  # the busiest rank's passes fed by another rank
        parts["pipeline_handoffs"] = max(stages.handoffs_per_rank(k.schedule, k.pp, m)) * handoff
    if k.pp > 1 and simulate:
        boundary = analysis.blocks[0].boundary_bytes * k.micro_batch / k.sp
        across = cluster.nodes > 1 and k.world // k.pp >= cluster.per_node
        msg = send_recv_time(cluster, boundary, across)
        fwd = [f + cf + pass_s + handoff * h for (f, _, _, cf, _), h in zip(passes, fwd_in)]
        # a split backward (ZB-H1, ZB-V): I recomputes and moves the input gradients (tp's
        # backward all-reduces are on that path); W is the weight gradients' half. Its
        # backward is two passes (I, W), each paying pass_s
        split = 2 if k.schedule in SPLIT_SCHEDULES else 1
        inp = [b / 2 + r + cb + pass_s + handoff * h for (_, b, r, _, cb), h in zip(passes, bwd_in)]
        sim_bwd = [b + split * pass_s + handoff * h for b, h in zip(bwd, bwd_in)]
        makespan = _pipeline(k, tuple(fwd), tuple(sim_bwd), tuple(inp), msg, where)
        parts["pp_bubble_and_p2p"] = max(0.0, makespan - sum(parts.values()))
    parts.update(_dp_and_optimizer(analysis, cluster, k, vstages, last_bwd, parts))
    return parts


def _rank_params(analysis: ModelAnalysis, k: Knobs, vstages: list[list[BlockCost]]) -> int:
    where = stages.placement(k)
    per_rank = [0] * k.pp
    for s, blocks in enumerate(vstages):
        per_rank[where[s]] += sum(b.params - b.tp_params + b.tp_params // k.tp for b in blocks)
    return max(per_rank)


def reductions(k: Knobs, blocks: list[BlockCost], n: int, wd: int) -> int:
    """Collectives of one reduction of a rank's gradients (and of one gather of its
    parameters): one per bucket (stages 1-2: ZERO_BUCKET_BYTES, LowLevelZero's
    reduce_bucket_size_in_m, its one-parameter chunks coalesced a bucket at a time as
    megalith_zero's buckets.py does since 0487308, at least one per parameter larger
    than a bucket; DDP's buckets) or stage-3 chunk."""
    total = n * wd
    if k.zero_stage in (1, 2):  # buckets of at most an eighth of the model (layout.py)
        return max(1, -(-total // max(1, min(ZERO_BUCKET_BYTES, -(-total // 8)))))
    if k.zero_stage == 3:
        if total <= ZERO3_ONE_CHUNK_BYTES:
            return 1
        lo, hi = ZERO3_CHUNK_RANGE
        return max(1, -(-total // min(hi, max(lo, total // 8))))
    return max(1, -(-total // DDP_BUCKET_BYTES))


def _dp_and_optimizer(
    analysis: ModelAnalysis,
    cluster: Cluster,
    k: Knobs,
    vstages: list[list[BlockCost]],
    last_bwd: float,
    parts: dict[str, float],
) -> dict[str, float]:
    prof = cluster.profile
    n = _rank_params(analysis, k, vstages)
    wd = working_bytes(k)
    stride = k.tp * k.sp
    overlap = DP_OVERLAP.get(prof.transport, 0.5)
    out: dict[str, float] = {}
    count = reductions(k, [b for blocks in vstages for b in blocks], n, wd) - 1
    if k.dp > 1:  # over dp alone: Ulysses' hooks summed the layers' gradients over sp
        op = "all_reduce" if k.zero_stage <= 1 else "reduce_scatter"
        reduce = collective_time(cluster, op, k.dp, n * wd, stride)
        reduce += count * latency(cluster, op, k.dp, stride)
        out["dp_reduce"] = max(0.0, reduce - overlap * last_bwd)
    gather = collective_time(cluster, "all_gather", k.dp, n * wd, stride)
    gather += count * latency(cluster, "all_gather", k.dp, stride)
    if k.zero_stage == 3 and k.dp > 1:
        hide = ZERO3_OVERLAP.get(prof.transport, 0.5) * parts["compute"]
        out["zero3_gather"] = max(0.0, 2 * gather * k.num_microbatches - hide)
    shard = -(-n // k.dp) if k.zero_stage >= 1 else n
    on_host = shard * k.offload_fraction
    out["optimizer"] = (shard - on_host) * ADAM_BYTES_PER_PARAM / prof.memory_bandwidth
    if k.zero_stage in (1, 2) and k.dp > 1:
        out["param_gather"] = gather
    if on_host:
        host = on_host / prof.host_adam_params_per_s
        host += on_host * wd / prof.d2h_bandwidth + on_host * wd / prof.h2d_bandwidth
        out["host_step"] = max(host * HOST_TAIL, host - last_bwd)
    return out


def _tied_head(analysis: ModelAnalysis, block: BlockCost) -> BlockCost:
    """The head of tied embeddings as tp shards it: its matmul uses the embedding's
    (vocabulary-parallel) weight, which the analysis counts in the "pre" block."""
    pre = analysis.pre
    if block is analysis.post and not block.tp_params and block.matmul_flops and pre.tp_params:
        return replace(block, params=pre.params, tp_params=pre.tp_params)
    return block


@lru_cache(maxsize=4096)
def _simulated(
    name: str, pp: int, m: int, fwd: tuple, bwd: tuple, inp: tuple, comm: float
) -> float:
    from megalith_pipeline.simulator import PassTimes, simulate

    times = [
        PassTimes(forward=f, backward=b, backward_input=i, backward_weight=b - i, comm=comm)
        for f, b, i in zip(fwd, bwd, inp)
    ]
    return simulate(stages.schedule(name, pp, m), times).makespan


def _pipeline(
    k: Knobs, fwd: tuple, bwd: tuple, inp: tuple, msg: float, where: tuple[int, ...]
) -> float:
    """The makespan of the step's pipeline: simulated for up to SIM_MICROBATCH_CAP x pp
    micro-batches, each one more adding the busiest rank's per-micro-batch time."""
    m = k.num_microbatches
    m_sim = stages.simulated_microbatches(k.pp, m)
    unit = max(fwd) or 1.0
    r = _SIM_DECIMALS
    norm = _simulated(
        k.schedule,
        k.pp,
        m_sim,
        tuple(round(f / unit, r) for f in fwd),
        tuple(round(b / unit, r) for b in bwd),
        tuple(round(i / unit, r) for i in inp),
        round(msg / unit, r),
    )
    stage_ids = range(len(where))
    busy = max(sum(fwd[s] + bwd[s] for s in stage_ids if where[s] == rank) for rank in range(k.pp))
    return norm * unit + (m - m_sim) * busy
