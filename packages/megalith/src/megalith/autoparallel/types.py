"""The planner's data: what a model costs (from its traced graph), what a machine can do
(from `megalith calibrate` or a built-in profile), and a scored candidate plan.

    analysis = analyze(model, seq_len=1024)         # analysis.py: meta-device trace
    profile = load_profile("h200")                  # profiles.py: JSON, or calibrate
    cluster = Cluster(nodes=1, gpus_per_node=8, profile=profile)
    ranked = search(analysis, cluster, global_batch_tokens=2**20)   # search.py
    ranked[0].to_json()

Units: FLOPs, bytes, seconds, bytes/s. Every cost of a ModelAnalysis is for ONE sequence
of `seq_len` tokens (micro-batch 1); a micro-batch of b costs b times as much (attention's
cost is quadratic in seq_len, linear in b).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

# ---------------------------------------------------------------------------- the model


@dataclass(frozen=True)
class OpRecord:
    """One traced aten op of the forward. kind: "matmul", "attention", "elementwise",
    "reduction" (norms, softmax, loss), "embedding" or "other". m, n, k: the matmul's
    shape (m rows of the output, n columns, k the inner size; 0 for other kinds)."""

    module: str  # path of the innermost module that ran it ("" for the root)
    op: str  # aten name, e.g. "aten.mm.default"
    kind: str
    flops: int
    bytes: int  # read + written
    m: int = 0
    n: int = 0
    k: int = 0


@dataclass(frozen=True)
class BlockCost:
    """A run of ops between two legal pipeline cuts: the embedding ("pre"), each repeated
    layer, and the head with the loss ("post"). All figures for one sequence."""

    name: str  # module path, e.g. "transformer.h.3"
    fwd_flops: int
    fwd_bytes: int
    matmul_flops: int  # the part of fwd_flops in matmuls (runs at the matmul rate)
    attention_flops: int  # the part in attention's score and value products
    params: int  # parameter count
    tp_params: int  # of those, the parameters the tp policy shards
    activation_bytes: int  # saved for backward without checkpointing
    boundary_bytes: int  # the block's output (what a pipeline cut sends, what a
    # checkpointed block keeps)
    tp_allreduce_bytes: int  # forward bytes all-reduced per tp rank under tp (row
    # parallel outputs); backward moves as much again
    ops: tuple[OpRecord, ...] = ()
    attention_io_bytes: int = 0  # q, k and v into the block's attention calls and their
    # outputs, k and v at q's head count: what Ulysses' four all-to-alls move (0: no
    # fused attention traced)
    param_tensors: int = 0  # parameter tensors the block reads first (under Ulysses one
    # gradient all-reduce each)


@dataclass(frozen=True)
class ModelAnalysis:
    """What `analyze` learns from one meta-device trace of the model."""

    model: str  # class name or preset name
    family: str | None  # tp policy name (gpt2, llama, bert, t5) or None: no tp
    seq_len: int
    param_dtype: str  # "bf16", "fp16" or "fp32": the training precision analysed
    params: int
    hidden: int
    layers: int
    heads: int  # attention heads (tp must divide it), 0 if none
    kv_heads: int
    vocab: int
    pre: BlockCost
    blocks: tuple[BlockCost, ...]  # the repeated layers; pipeline cuts fall between them
    post: BlockCost

    @property
    def fwd_flops(self) -> int:
        return self.pre.fwd_flops + sum(b.fwd_flops for b in self.blocks) + self.post.fwd_flops

    @property
    def tied_head(self) -> bool:
        """The head multiplies by a weight the trace counted elsewhere: the embedding's
        (tie_word_embeddings). A matmul of 2 x tokens x weight flops reads more weights
        than the head holds."""
        return self.post.matmul_flops > 2 * self.seq_len * self.post.params


# -------------------------------------------------------------------------- the machine


@dataclass(frozen=True)
class AlphaBeta:
    """time(bytes) = latency + bytes / bandwidth, measured for one collective at one
    group size (bandwidth is the bus bandwidth: bytes of the buffer over time, as
    nccl-tests' algbw)."""

    latency_s: float
    bandwidth: float

    def time(self, nbytes: float) -> float:
        return self.latency_s + nbytes / self.bandwidth if nbytes > 0 else 0.0


@dataclass(frozen=True)
class MachineProfile:
    """What one node can do, as the cost model needs it.

    matmul: FLOP/s per dtype ("bf16", "fp16", "fp32") and shape class ("small": m*n*k <
        2**27, "medium": < 2**33, "large"); attention: FLOP/s of attention per dtype.
    collectives: per op ("all_reduce", "reduce_scatter", "all_gather", "broadcast",
        "send_recv") a map group size (as str, JSON keys) -> AlphaBeta within a node.
    split_backward_call_s: seconds a split backward (ZB-V's W, one autograd call per
        frontier node) adds per frontier node and micro-batch (calibrate_split.py);
        0.0 where not measured (profiles written before calibrate measured it).
    pipeline_pass_s: seconds every pipeline pass (one forward, backward, I or W of one
        micro-batch on one stage) costs beside its compute: the executor's bookkeeping,
        the message hand-over, the pass's autograd call (calibrate_pass.py); 0.0 where
        not measured, as split_backward_call_s.
    pipeline_handoff_s: seconds a pipeline pass whose input comes from another rank
        waits beyond the message: ~0 where every rank has a core, the sender's
        descheduling where ranks outnumber the cores (calibrate_handoff.py); 0.0 where
        not measured.
    """

    name: str
    device: str  # "cuda" or "cpu"
    device_name: str
    devices_per_node: int
    device_memory_bytes: int
    host_memory_bytes: int
    matmul: dict[str, dict[str, float]]
    attention: dict[str, float]
    memory_bandwidth: float  # device memory, bytes/s (elementwise ops run at it)
    host_adam_params_per_s: float  # the engine's CPU Adam, one rank
    h2d_bandwidth: float  # pinned
    d2h_bandwidth: float
    disk_read_bandwidth: float
    disk_write_bandwidth: float
    collectives: dict[str, dict[str, AlphaBeta]]
    transport: str  # "nccl" or "gloo"
    split_backward_call_s: float = 0.0
    pipeline_pass_s: float = 0.0
    pipeline_handoff_s: float = 0.0
    measured: str = ""  # when and how (calibrate's command line, or "built-in")

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> MachineProfile:
        data = dict(data)
        data["collectives"] = {
            op: {g: AlphaBeta(**ab) for g, ab in sizes.items()}
            for op, sizes in data["collectives"].items()
        }
        return cls(**data)

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_json(), indent=1) + "\n")

    @classmethod
    def load(cls, path: str | Path) -> MachineProfile:
        return cls.from_json(json.loads(Path(path).read_text()))


@dataclass(frozen=True)
class Cluster:
    """nodes x devices_per_node of one profile, and the link between nodes (per node,
    each way). A cluster file is this as JSON, with the profile by name or path."""

    profile: MachineProfile
    nodes: int = 1
    gpus_per_node: int | None = None  # None: the profile's devices_per_node
    inter_node: AlphaBeta | None = None  # None: single node
    host_memory_bytes: int | None = None  # per node; None: the profile's
    device_memory_bytes: int | None = None  # per device; None: the profile's

    @property
    def per_node(self) -> int:
        return self.gpus_per_node or self.profile.devices_per_node

    @property
    def world(self) -> int:
        return self.nodes * self.per_node


# --------------------------------------------------------------------------- the plan


@dataclass(frozen=True)
class Candidate:
    """One configuration and what the cost model predicts for it. `offload` is "none",
    "host" or "host+nvme"; offload_fraction the share of optimizer state moved there;
    ckpt the share of layers whose activations are recomputed (0.0 to 1.0);
    schedule "1f1b", "interleaved" or "zbv" (pp > 1) or "none"."""

    dp: int
    tp: int
    pp: int
    sp: int
    zero_stage: int
    offload: str
    offload_fraction: float
    micro_batch: int
    num_microbatches: int
    ckpt: float
    schedule: str
    predicted_step_s: float
    predicted_tokens_per_s: float
    predicted_peak_bytes: int  # per device
    predicted_mfu: float
    breakdown: dict[str, float] = field(default_factory=dict)  # seconds per part
    reason: str = ""

    @property
    def plugin(self) -> str:
        """The megalith plugin that runs it (Strategy's names)."""
        if self.tp > 1 or self.pp > 1 or self.sp > 1:
            return "hybrid"
        return {0: "ddp", 1: "zero1", 2: "zero2", 3: "gemini"}[self.zero_stage]

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "plugin": self.plugin}
