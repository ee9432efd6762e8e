"""The ZB-V split backward's W pass before and after W became "once per step" (issue 18).

    python benchmarks/pipeline/zbv_split_w.py [--steps 6] [--out FILE.md]

Spawns 4 CPU ranks (Gloo, one thread each): pp 2 x dp 2, ZB-V, megalith_zero stage 1 over
dp (driven through its no_sync, as the HybridParallel plugin does), megalith.models'
gpt-tiny with 8 blocks, 8 micro-batches of 2 rows (seq 64) per dp rank, each with and
without per-block activation checkpointing. "before" replays the earlier W pass (one
plain torch.autograd.backward per frontier node: ZeRO's end-of-backward reduction after
each call of the step's last W pass, a checkpointed block recomputed per call); "after"
is megalith_pipeline's WeightPass.run. The four runners take turns, one step each per
round. Per step and rank: the W time (sum of its W spans), the step time, and how many
synchronised backward ends ZeRO saw (each reduces every chunk still unreduced).
Medians over the timed steps (the first step is warm-up).
"""

from __future__ import annotations

import argparse
import datetime as dt
import statistics
from pathlib import Path

import torch

from megalith.models import create, get_config

CONFIG = get_config(
    "gpt-tiny", n_layers=8, max_seq_len=64, vocab_size=2048, tie_word_embeddings=False
)
PER_DP = 16


def loss_fn(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.cross_entropy(
        logits.reshape(-1, logits.shape[-1]), targets.reshape(-1)
    )


def _old_run(self, no_sync=None) -> None:
    """The W pass as it was: every call its own backward, outside no_sync and any group."""
    for roots, grads, weights in self._calls:
        if roots and weights:
            torch.autograd.backward(roots, grads, inputs=weights)
    self._calls = []


def worker(rank: int, cfg: dict) -> dict:
    import megalith_comm as comm
    import megalith_zero as zero
    from megalith_pipeline import Pipeline
    from megalith_pipeline.backward_split import WeightPass
    from megalith_pipeline.schedule import WEIGHT_GRAD

    torch.set_num_threads(1)
    new_run = WeightPass.run
    g = torch.Generator().manual_seed(1)
    shape = (PER_DP, CONFIG.max_seq_len)
    x = torch.randint(0, CONFIG.vocab_size, shape, generator=g)
    y = torch.randint(0, CONFIG.vocab_size, shape, generator=g)
    runners = []
    for ckpt in (False, True):
        for variant in ("before", "after"):
            mesh = comm.Mesh(None, pp=2, dp=2)
            model = create(CONFIG, device="cpu", seed=0)
            model.set_activation_checkpointing(ckpt)
            pipe = Pipeline(model, num_microbatches=8, schedule="zb-v", mesh=mesh, loss_fn=loss_fn)
            opt = torch.optim.SGD(pipe.module.parameters(), lr=0.0)
            _, zopt = zero.shard(pipe.module, opt, zero.ZeroConfig(stage=1), mesh=mesh, axis="dp")
            runners.append((ckpt, variant, pipe, zopt, mesh))
    rows: dict[tuple[bool, str], list[tuple[float, float, int]]] = {}
    for step in range(cfg["steps"] + 1):
        for ckpt, variant, pipe, zopt, _mesh in runners:
            WeightPass.run = _old_run if variant == "before" else new_run
            comm.barrier()
            before = zopt.reducer.synced_backwards
            pipe.step(x, y, no_sync=zopt.no_sync)
            zopt.zero_grad()
            s = pipe.last_stats
            w = sum(t1 - t0 for k, _, _, t0, t1 in s.spans if k == WEIGHT_GRAD)
            if step:
                rows.setdefault((ckpt, variant), []).append(
                    (w, s.end - s.start, zopt.reducer.synced_backwards - before)
                )
    WeightPass.run = new_run
    return {
        "pp_rank": runners[0][4].coord("pp"),
        "rows": {
            f"{int(ckpt)}/{v}": [statistics.median(c) for c in zip(*r)]
            for (ckpt, v), r in rows.items()
        },
    }


def main() -> None:
    from megalith.testing import run_distributed

    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    results = run_distributed(worker, 4, {"steps": args.steps}, timeout=900)
    lines = [
        "| checkpointing | W pass | rank | pp rank | W s | step s | ZeRO reductions of all chunks |",
        "|---|---|---|---|---|---|---|",
    ]
    for key in ("0/before", "0/after", "1/before", "1/after"):
        ckpt, variant = key.split("/")
        for rank, r in enumerate(results):
            w, step, red = r["rows"][key]
            lines.append(
                f"| {'per block' if ckpt == '1' else 'off'} | {variant} | {rank} | "
                f"{r['pp_rank']} | {w:.4f} | {step:.4f} | {red:g} |"
            )
    text = "\n".join(lines)
    print(text)
    if args.out:
        head = f"`benchmarks/pipeline/zbv_split_w.py --steps {args.steps}`, {dt.date.today()}\n\n"
        args.out.write_text(head + text + "\n")


if __name__ == "__main__":
    main()
