"""Where ZeRO-Offload would put a model's training state, without allocating any of it:
the chunks per tier and the bytes on the GPU, in host memory and on NVMe for given
budgets. Sizes the largest-model runs before they spend device time.

    python benchmarks/zero/offload_plan.py --model gpt-13b --layers 57 \
        --tier host+nvme --device-budget-gb 60 --host-budget-gb 110

The model is built on the meta device. GPU bytes are the working parameters and
gradients (bf16 at stage 2, every chunk whole at world 1) plus the masters and states
kept on the device; activations, one chunk's gradients in flight and the allocator's
slack come on top.
"""

from __future__ import annotations

import argparse
from collections import Counter

import torch

import megalith_offload as mo
from megalith import models
from megalith_zero.api import _param_groups
from megalith_zero.layout import chunk_numel_for
from megalith_zero.layout import plan as layout_plan

GB = 1e9


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="gpt-13b")
    ap.add_argument("--layers", type=int, default=0, help="override the layer count")
    ap.add_argument("--tier", default="host+nvme")
    ap.add_argument("--optim-frac", type=float, default=0.0)
    ap.add_argument("--device-budget-gb", type=float, default=60)
    ap.add_argument("--host-budget-gb", type=float, default=110)
    ap.add_argument("--master-tier", default="host", help="nvme: NVMe chunks' masters in files")
    a = ap.parse_args()
    extra = {"n_layers": a.layers} if a.layers else {}
    model = models.create(a.model, **extra)  # meta: nothing allocated
    n = sum(p.numel() for p in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    params = _param_groups(model, opt)
    wd = rd = 2  # bf16 working params and gradients
    layout = layout_plan(params, 1, chunk_numel_for([p.numel() for _, p, _ in params], 0, wd, 1))
    costs = [
        mo.ChunkCost(
            device=4 * s * 3,
            master=4 * s,
            states=8 * s,
            swap=mo.file_bytes(s, 2),
            step_staging=s * (wd + rd),
        )
        for s in (c.shard_numel for c in layout.chunks)
    ]
    config = mo.OffloadConfig(
        tier=a.tier,
        optim_frac=a.optim_frac,
        device_budget_bytes=int(a.device_budget_gb * GB),
        host_budget_bytes=int(a.host_budget_gb * GB),
        master_tier=a.master_tier,
    )
    plan = mo.plan(costs, config)
    chunk_mib = max(c.numel for c in layout.chunks) * wd / 2**20
    print(f"{a.model} ({n / 1e9:.2f}B params): {len(costs)} chunks of up to {chunk_mib:.0f} MiB")
    print(f"chunks per tier: {dict(Counter(plan.tiers))}")
    gpu = (wd + rd) * n + plan.device_bytes
    print(
        f"GPU {gpu / GB:.1f} GB (params and grads {(wd + rd) * n / GB:.1f}, masters and states "
        f"{plan.device_bytes / GB:.1f}); host {plan.host_bytes / GB:.1f} GB; "
        f"NVMe {plan.nvme_bytes / GB:.1f} GB"
    )


if __name__ == "__main__":
    main()
