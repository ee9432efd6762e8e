"""Lent H200: a 1.3B GPT (d2048 L24 h16, seq 2048, bf16) through each of megalith's paths
beside plain torch (fp32 weights, bf16 autocast, fused AdamW; ../shared/ANCHORS.md:
58,651 tok/s, 53.8% MFU at micro-batch 16), same process, one after another.

Modes: torch, zero2, zero3 (megalith_zero.shard; issue 4), zero2-offload and
zero3-offload (every master and optimizer state in pinned host memory; issue 5), booster-ddp and booster-zero2
(the Booster with TorchDDPPlugin / LowLevelZeroPlugin; issue 7), hybrid-tp1
(HybridParallelPlugin(tp_size=1)) and tp1-layers (the model sharded by its tensor-parallel
policy over a one-rank group, so every tp layer and its collectives run; issue 9).

    python -m torch.distributed.run --nproc_per_node 1 benchmarks/zero/gpu_gpt.py \
        --batch 16 --out benchmarks/results/zero_gpu/<date>_<machine>_gpt1p3b.md

--tokens-per-step T (issue 20) makes each optimizer step T tokens: gradient accumulation
over T / (batch * seq) micro-batches of --batch sequences, all but the last under the
mode's no_sync (ZeRO's gradient buffers accumulate on the GPU; with the update in
backward the host update overlaps the last micro-batch's backward only). Rows report
tokens/s, 6N-TFLOPS (6 * parameters * tokens/s, MegaTrain's basis) and MFU.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import time
import traceback
from collections.abc import Callable
from pathlib import Path

import torch

import megalith_comm as comm
from megalith import models

H200_BF16_PEAK = 989e12  # datasheet dense bf16, as ANCHORS.md's MFU


def flops_per_token(model: torch.nn.Module, seq: int) -> float:
    cfg = model.config
    n = sum(p.numel() for p in model.parameters())
    return 6 * n + 12 * cfg.n_layers * cfg.d_model * seq


def accumulate(micro: list[torch.Tensor], backward, no_sync) -> torch.Tensor:
    """One optimizer step's backwards over the micro-batches, each loss divided by their
    count; all but the last under no_sync(). Returns the mean loss."""
    total = 0.0
    for i, ids in enumerate(micro):
        last = i == len(micro) - 1
        with contextlib.nullcontext() if last else no_sync():
            loss = backward(ids, len(micro))
        total = total + loss.detach()
    return total / len(micro)


def plain_torch(model):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)

    def backward(ids, k):
        with torch.autocast(ids.device.type, dtype=torch.bfloat16):
            loss = model(ids, labels=ids)[0]
        (loss / k).backward()
        return loss

    def step(micro):
        loss = accumulate(micro, backward, contextlib.nullcontext)  # one rank: no reduction
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    return step


def zero_stage(stage: int, offload: bool = False, early: bool = False):
    """ZeRO at `stage`; offload: fp32 masters and optimizer states offloaded as OFFLOAD
    says (default: every chunk's in host memory); chunks updated during backward when
    `early` (ZeroConfig.step_in_backward)."""

    def build(model):
        import megalith_zero as zero

        extra = {}
        if offload:
            from megalith_offload import OffloadConfig

            extra["offload"] = OffloadConfig(**OFFLOAD)
        net, opt = zero.shard(
            model,
            torch.optim.AdamW(model.parameters(), lr=1e-4),
            zero.ZeroConfig(
                stage=stage,
                precision="bf16",
                step_in_backward=early,
                keep_gathered_bytes=KEEP_GATHERED[0] if stage == 3 else 0,
                **extra,
            ),
        )

        def backward(ids, k):
            loss = net(ids, labels=ids)[0]
            opt.backward(loss / k)
            return loss

        def step(micro):
            loss = accumulate(micro, backward, opt.no_sync)
            opt.step()
            opt.zero_grad()
            return loss

        def placement() -> dict:
            """Chunks per tier, and the engine's peak bytes per kind and tier (GB)."""
            tiers = [c.tier for c in net.chunks if c.trainable]
            peaks = {k: round(u.peak_bytes / 1e9, 2) for k, u in net.memory_report().items()}
            out = {"chunks": {t: tiers.count(t) for t in sorted(set(tiers))}, "peak_gb": peaks}
            if opt.visit_frac:  # the fraction used, and with "auto" the timings behind it
                out["visit_frac"] = opt.visit_frac
            if opt.visit_timing:
                out["visit_ns_per_param"] = [round(t * 1e9, 4) for t in opt.visit_timing]
            return out

        step.placement = placement
        return step

    return build


def booster(make_plugin: Callable[[], object], fused: bool):
    def build(model):
        from megalith.booster import Booster

        b = Booster(plugin=make_plugin())
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=fused)
        net, opt, *_ = b.boost(model, opt)

        def backward(ids, k):
            loss = net(ids, labels=ids)[0]
            b.backward(loss / k, opt)
            return loss

        def no_sync():
            try:
                return b.no_sync(net, opt)
            except NotImplementedError:  # each backward reduces: the same sum
                return contextlib.nullcontext()

        def step(micro):
            loss = accumulate(micro, backward, no_sync)
            opt.step()
            opt.zero_grad()
            return loss

        return step

    return build


def tp1_layers(model):
    from megalith.tensor_parallel import shard_model

    mesh = comm.Mesh(comm.get_world(), dp=1, tp=1, name="tp1")
    shard_model(model, mesh.group("tp"))
    return plain_torch(model)


def modes() -> dict[str, Callable]:
    from megalith.booster.plugin import HybridParallelPlugin, LowLevelZeroPlugin, TorchDDPPlugin

    return {
        "torch": plain_torch,
        "zero2": zero_stage(2),
        "zero3": zero_stage(3),
        "zero2-early": zero_stage(2, early=True),
        "zero2-offload": zero_stage(2, offload=True, early=True),
        "zero2-offload-after": zero_stage(2, offload=True),
        "zero3-offload": zero_stage(3, offload=True, early=True),
        "booster-ddp": booster(lambda: _ddp_bf16(TorchDDPPlugin), fused=True),
        "booster-zero2": booster(lambda: LowLevelZeroPlugin(stage=2, precision="bf16"), False),
        "hybrid-tp1": booster(lambda: HybridParallelPlugin(tp_size=1, precision="bf16"), True),
        "tp1-layers": tp1_layers,
    }


def _ddp_bf16(cls):
    p = cls()
    p.set_precision("bf16")
    return p


def used_gib() -> float:
    free, total = torch.cuda.mem_get_info()
    return (total - free) / 2**30


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


#: ZeroConfig.keep_gathered_bytes of the stage 3 modes (--keep-gathered-gb)
KEEP_GATHERED = [0]

#: OffloadConfig arguments of the offload modes (--tier, --optim-frac, --host-budget-gb,
#: --device-budget-gb, --swap-dir, --placement, --param-frac, --visit-frac)
OFFLOAD: dict = {"tier": "host"}


def run(
    mode: str,
    build,
    model_name: str,
    ckpt: bool,
    batch: int,
    seq: int,
    steps: int,
    warmup: int,
    layers: int = 0,
    init_dtype: torch.dtype | None = None,
    tokens_per_step: tuple[int, ...] = (0,),
) -> list[dict]:
    """One row per entry of tokens_per_step, all on the one model `build` made (the
    largest models take minutes to build and to place); the warm-up steps run before the
    first entry only (the micro-batch, so the memory, is the same for every entry)."""
    cuda = torch.cuda.is_available()  # CPU only for a smoke test of this script
    dev = torch.device("cuda" if cuda else "cpu")
    extra = {"n_layers": layers} if layers else {}
    model = models.create(
        model_name, device=dev, dtype=init_dtype, seed=0, activation_checkpointing=ckpt, **extra
    )
    params = sum(p.numel() for p in model.parameters())
    fpt = flops_per_token(model, seq)
    vocab = min(50257, model.config.vocab_size)  # GPT-2's tokens, in a padded vocabulary
    step = build(model)
    rows = []
    for n, tokens in enumerate(tokens_per_step):
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        k = micro_batches(tokens, batch, seq)
        g = torch.Generator(device=dev).manual_seed(0)
        ids = [torch.randint(0, vocab, (batch, seq), device=dev, generator=g) for _ in range(2 * k)]
        data = [ids[:k], ids[k:]]  # two steps' micro-batches, alternating
        for i in range(warmup if n == 0 else 0):
            step(data[i % 2])
        sync()
        t0 = time.perf_counter()
        for i in range(steps):
            loss = step(data[i % 2])
        sync()
        dt = (time.perf_counter() - t0) / steps
        tps = k * batch * seq / dt
        rows.append(
            {
                "mode": mode,
                "params_b": round(params / 1e9, 2),
                "tokens_per_step": k * batch * seq,
                "micro_batches": k,
                "tokens_per_s": tps,
                "tflops_6n": 6 * params * tps / 1e12,
                "mfu": tps * fpt / H200_BF16_PEAK,
                "step_s": dt,
                "peak_gib": torch.cuda.max_memory_allocated() / 2**30 if cuda else 0.0,
                # torch's peak misses the engine's chunk memory (ZeRO's states); the
                # device's own count after the steps has both, plus torch's cache
                "device_gib": used_gib() if cuda else 0.0,
                "loss": float(loss.detach()),
                **({"placement": step.placement()} if hasattr(step, "placement") else {}),
            }
        )
        print(rows[-1], flush=True)
    return rows


def micro_batches(tokens_per_step: int, batch: int, seq: int) -> int:
    """Micro-batches per optimizer step: tokens_per_step / (batch * seq), whole; 1 for 0."""
    per_micro = batch * seq
    if not tokens_per_step:
        return 1
    if tokens_per_step < per_micro or tokens_per_step % per_micro:
        raise SystemExit(
            f"--tokens-per-step {tokens_per_step} is not a whole number of micro-batches of "
            f"--batch {batch} x --seq {seq} = {per_micro} tokens: pass a multiple of {per_micro}"
        )
    return tokens_per_step // per_micro


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="gpt-1.3b")
    ap.add_argument("--ckpt", action="store_true", help="activation checkpointing")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--modes", default=",".join(modes()))
    ap.add_argument("--layers", type=int, default=0, help="override the model's layer count")
    ap.add_argument("--optim-frac", type=float, default=1.0)
    ap.add_argument("--tier", default="host", help="offload modes: host, nvme or host+nvme")
    ap.add_argument("--host-budget-gb", type=float, default=0, help="offload modes (0: none)")
    ap.add_argument("--device-budget-gb", type=float, default=0, help="offload modes (0: none)")
    ap.add_argument("--swap-dir", default=None, help="offload modes with NVMe")
    ap.add_argument(
        "--placement",
        default="static",
        help="offload modes: static, or auto (the warm-up step measures, then the chunks "
        "that fit --device-budget-gb, or the whole GPU, move back to it)",
    )
    ap.add_argument(
        "--param-frac", type=float, default=0.0, help="zero3-offload: param shards on the host"
    )
    ap.add_argument(
        "--visit-frac",
        type=lambda v: v if v == "auto" else float(v),
        default=0.0,
        help="offload modes: host chunks the GPU updates, their states streamed",
    )
    ap.add_argument(
        "--master-tier",
        default="host",
        help="offload modes with NVMe: nvme puts the NVMe chunks' fp32 masters in their files",
    )
    ap.add_argument(
        "--init-dtype",
        default="fp32",
        help="dtype the model is built in (bf16 halves the build's peak for the largest "
        "models; the fp32 masters then start from bf16 values)",
    )
    ap.add_argument(
        "--keep-gathered-gb",
        type=float,
        default=0,
        help="stage 3 modes: chunks kept gathered from forward to backward (GB)",
    )
    ap.add_argument(
        "--tokens-per-step",
        type=lambda v: tuple(int(t) for t in v.split(",")),
        default=(0,),
        help="tokens per optimizer step: gradient accumulation over micro-batches of --batch "
        "sequences (a multiple of batch * seq); 0: one micro-batch; a comma-separated list "
        "measures each in turn on the same model",
    )
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    per_step = [(t or a.batch * a.seq, micro_batches(t, a.batch, a.seq)) for t in a.tokens_per_step]
    KEEP_GATHERED[0] = int(a.keep_gathered_gb * 1e9)
    OFFLOAD.update(
        tier=a.tier,
        optim_frac=a.optim_frac,
        swap_dir=a.swap_dir,
        placement=a.placement,
        param_frac=a.param_frac,
        visit_frac=a.visit_frac,
        master_tier=a.master_tier,
    )
    if a.host_budget_gb:
        OFFLOAD["host_budget_bytes"] = int(a.host_budget_gb * 1e9)
    if a.device_budget_gb:
        OFFLOAD["device_budget_bytes"] = int(a.device_budget_gb * 1e9)
    init_dtype = {"fp32": None, "bf16": torch.bfloat16}[a.init_dtype]
    comm.init()
    table = modes()
    rows = []
    for m in a.modes.split(","):
        try:
            rows.extend(
                run(
                    m,
                    table[m],
                    a.model,
                    a.ckpt,
                    a.batch,
                    a.seq,
                    a.steps,
                    a.warmup,
                    a.layers,
                    init_dtype,
                    a.tokens_per_step,
                )
            )
        except Exception:
            traceback.print_exc()
            rows.append(
                {"mode": m, "error": traceback.format_exc(limit=1).strip().splitlines()[-1]}
            )
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    # plain torch at the same tokens per step
    base = {r["tokens_per_step"]: r["tokens_per_s"] for r in rows if r["mode"] == "torch"}
    lines = [
        f"# {a.model}{f' ({a.layers} layers)' if a.layers else ''}, seq {a.seq}, micro-batch {a.batch}, "
        f"tokens per step {', '.join(f'{t} ({k} micro-batches)' for t, k in per_step)}, "
        f"bf16, ckpt {a.ckpt}, "
        f"one {torch.cuda.get_device_name() if torch.cuda.is_available() else 'CPU'}, "
        f"{time.strftime('%Y-%m-%d')}",
        "",
        "MFU counts 6N + 12*L*d*seq flops per token against 989 TFLOP/s (as ANCHORS.md); "
        "6N-TFLOPS is 6 * parameters * tokens/s (MegaTrain's basis).",
        "",
        "| run | tokens/step | tokens/s | vs plain torch | 6N-TFLOPS | MFU | step (s) "
        "| torch peak (GiB) | device used (GiB) | loss |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['mode']} | | failed: {r['error']} | | | | | | | |")
            continue
        peer = base.get(r["tokens_per_step"])
        ratio = f"{r['tokens_per_s'] / peer:.3f}x" if peer else "-"
        lines.append(
            f"| {r['mode']} | {r['tokens_per_step']:,} | {r['tokens_per_s']:,.0f} | {ratio} | "
            f"{r['tflops_6n']:.1f} | "
            f"{r['mfu']:.1%} | "
            f"{r['step_s']:.3f} | {r['peak_gib']:.1f} | {r['device_gib']:.1f} | {r['loss']:.4f} |"
        )
    text = "\n".join(lines) + "\n"
    print(text)
    if a.out:
        Path(a.out).write_text(text)


if __name__ == "__main__":
    main()
