"""How long a block's forward takes on one rank, from the profile's rates.

Matmuls run at the profile's matmul rate for their shape class after sharding (m rows
over sp and the micro-batch, the sharded side over tp), attention at the attention rate,
everything else at memory bandwidth from the bytes it moves. Backward is
BACKWARD_FACTOR forwards (the input and the weight gradient of each matmul).
"""

from __future__ import annotations

from .knobs import Knobs
from .memory import TP_SHARDED_ACTIVATIONS
from .types import BlockCost, MachineProfile

BACKWARD_FACTOR = 2.0
#: the share of the profile's kernel rates that a training step's ops reach, per device
#: kind: calibrate times each kernel alone on a rank's share of the cores, while a step
#: runs every rank's small ops at once (on CPU ranks that share cores, with the
#: interpreter's cost per op). cpu: fitted on the CPU grid (benchmarks/results/
#: autoparallel/2026-12-02_cpu_grid.md, the DDP configurations); cuda: fitted on the
#: H200 grid (2026-12-02_h200_grid.md: 9 configurations, leave-one-out step-time error
#: median 3.5%, worst 9.7%)
COMPUTE_EFFICIENCY = {"cpu": 0.335, "cuda": 0.81}
#: MachineProfile.matmul's shape classes: m * n * k below each bound
SHAPE_CLASSES = (("small", 2**27), ("medium", 2**33))
#: kinds of OpRecord that are not matmuls or attention (they run at memory bandwidth)
_MATMUL, _ATTENTION = "matmul", "attention"


def shape_class(mnk: float) -> str:
    for name, bound in SHAPE_CLASSES:
        if mnk < bound:
            return name
    return "large"


def matmul_rate(profile: MachineProfile, precision: str, mnk: float) -> float:
    rates = profile.matmul.get(precision) or profile.matmul["fp32"]
    return rates.get(shape_class(mnk)) or max(rates.values())


def attention_rate(profile: MachineProfile, precision: str) -> float:
    return profile.attention.get(precision) or profile.attention.get("fp32") or 1e9


def tp_divisor(block: BlockCost, tp: int) -> float:
    """How much tp divides the block's matmul work: its sharded share of parameters."""
    if tp == 1 or block.params == 0:
        return float(tp if block.params == 0 and block.tp_params else 1)
    share = block.tp_params / block.params
    return 1.0 / (share / tp + (1.0 - share))


def forward_time(
    block: BlockCost, knobs: Knobs, profile: MachineProfile, seq_len: int, hidden: int
) -> float:
    """Seconds of one micro-batch's forward of `block` on one rank."""
    b, sp, precision = knobs.micro_batch, knobs.sp, knobs.precision
    div = tp_divisor(block, knobs.tp)
    per_rank = b / (sp * div)
    rest_share = TP_SHARDED_ACTIVATIONS / knobs.tp + (1 - TP_SHARDED_ACTIVATIONS)
    bandwidth = profile.memory_bandwidth
    t = block.attention_flops * b / (sp * knobs.tp) / attention_rate(profile, precision)
    matmuls = [op for op in block.ops if op.kind == _MATMUL]
    if matmuls:
        for op in matmuls:
            mnk = op.m * op.n * op.k * per_rank
            flops = op.flops * per_rank
            t += max(flops / matmul_rate(profile, precision, mnk), op.bytes * per_rank / bandwidth)
        rest = sum(op.bytes for op in block.ops if op.kind not in (_MATMUL, _ATTENTION))
    else:  # no op records: a (seq x hidden) @ (hidden x hidden) class, all bytes at bandwidth
        mnk = seq_len * hidden * hidden * per_rank
        t += block.matmul_flops * per_rank / matmul_rate(profile, precision, mnk)
        rest = block.fwd_bytes
    t += rest * (b / sp) * rest_share / bandwidth
    return t / COMPUTE_EFFICIENCY.get(profile.device, 1.0)
