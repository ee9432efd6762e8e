"""Hand-built planner inputs for the cost-model and search tests: a ModelAnalysis from
GPT's known formulas (Megatron's activation count, 24 s h^2 matmul FLOPs per layer) and
MachineProfiles shaped like an H200 node and a 2-core CPU box."""

from __future__ import annotations

from megalith.autoparallel import AlphaBeta, BlockCost, Cluster, MachineProfile, ModelAnalysis

BF16 = 2


def gpt_analysis(
    hidden: int = 1024,
    layers: int = 8,
    heads: int = 16,
    seq_len: int = 1024,
    vocab: int = 50304,
    kv_heads: int | None = None,
) -> ModelAnalysis:
    h, s, v = hidden, seq_len, vocab
    layer = [
        BlockCost(
            name=f"h.{i}",
            fwd_flops=24 * s * h * h + 4 * s * s * h + 30 * s * h,
            fwd_bytes=34 * s * h * BF16,
            matmul_flops=24 * s * h * h,
            attention_flops=4 * s * s * h,
            params=12 * h * h + 13 * h,
            tp_params=12 * h * h + 7 * h,
            activation_bytes=s * h * 34 + 5 * heads * s * s,
            boundary_bytes=s * h * BF16,
            tp_allreduce_bytes=2 * s * h * BF16,
        )
        for i in range(layers)
    ]
    pre = BlockCost(
        "pre", 0, 3 * s * h * BF16, 0, 0, v * h + s * h, v * h, s * h * BF16, s * h * BF16, 0
    )
    post = BlockCost(
        "post",
        2 * s * h * v,
        3 * s * v * 4,
        2 * s * h * v,
        0,
        2 * h,
        0,
        2 * s * v * 4,
        s * h * BF16,
        0,
    )
    params = pre.params + post.params + sum(b.params for b in layer)
    return ModelAnalysis(
        model=f"gpt-h{h}-l{layers}",
        family="gpt2",
        seq_len=s,
        param_dtype="bf16",
        params=params,
        hidden=h,
        layers=layers,
        heads=heads,
        kv_heads=kv_heads or heads,
        vocab=v,
        pre=pre,
        blocks=tuple(layer),
        post=post,
    )


def _collectives(bandwidth: float, latency: float, sizes: tuple[int, ...]) -> dict:
    ops = ("all_reduce", "reduce_scatter", "all_gather", "broadcast", "send_recv")
    return {op: {str(g): AlphaBeta(latency, bandwidth) for g in sizes} for op in ops}


def h200_like() -> MachineProfile:
    return MachineProfile(
        name="h200-like",
        device="cuda",
        device_name="H200",
        devices_per_node=8,
        device_memory_bytes=141 * 10**9,
        host_memory_bytes=2 * 10**12,
        matmul={
            "bf16": {"small": 150e12, "medium": 500e12, "large": 700e12},
            "fp32": {"small": 30e12, "medium": 50e12, "large": 55e12},
        },
        attention={"bf16": 400e12, "fp32": 40e12},
        memory_bandwidth=4.0e12,
        host_adam_params_per_s=4.7e9,
        h2d_bandwidth=55e9,
        d2h_bandwidth=55e9,
        disk_read_bandwidth=5e9,
        disk_write_bandwidth=3e9,
        collectives=_collectives(150e9, 20e-6, (2, 4, 8)),
        transport="nccl",
        measured="test",
    )


def cpu_like() -> MachineProfile:
    return MachineProfile(
        name="cpu-like",
        device="cpu",
        device_name="cpu",
        devices_per_node=4,
        device_memory_bytes=8 * 10**9,
        host_memory_bytes=8 * 10**9,
        matmul={"fp32": {"small": 20e9, "medium": 40e9, "large": 50e9}},
        attention={"fp32": 10e9},
        memory_bandwidth=5e9,
        host_adam_params_per_s=2e8,
        h2d_bandwidth=5e9,
        d2h_bandwidth=5e9,
        disk_read_bandwidth=1e9,
        disk_write_bandwidth=1e9,
        collectives=_collectives(1e9, 100e-6, (2, 4)),
        transport="gloo",
        measured="test",
    )


def h200_cluster(nodes: int = 1) -> Cluster:
    inter = AlphaBeta(10e-6, 400e9) if nodes > 1 else None
    return Cluster(profile=h200_like(), nodes=nodes, inter_node=inter)
