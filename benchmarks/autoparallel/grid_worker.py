"""One configuration of the AutoParallel grid, on every rank of one `megalith run` job:
the model through the real Booster and the plugin a user would pick for it, timed over
several optimizer steps, its memory measured over one more. grid.py starts it:

    megalith run --nproc_per_node 4 benchmarks/autoparallel/grid_worker.py '<config json>'

The config (grid.py's Config as JSON): the model (a megalith.models preset and field
overrides), seq_len, dp/tp/pp, zero_stage, offload_fraction, micro_batch,
num_microbatches (a pipeline's micro-batches; without one, gradient accumulation under
booster.no_sync), ckpt (the share of each rank's layers checkpointed), the schedule, the
precision, steps and warm-up, the device.

Plugins: tp, pp or sp > 1 -> HybridParallelPlugin(tp_size, pp_size, zero_stage, ...; sp > 1:
sp_size with sequence_parallelism_mode="all_to_all");
stage 0 -> TorchDDPPlugin; 1, 2 -> LowLevelZeroPlugin(stage); 3 -> GeminiPlugin.

Step time: each step starts after a barrier and ends after the optimizer step and a
barrier (the slowest rank's step), rank 0's clock; the median over the timed steps.
Memory (see live_bytes.py on CPU ranks): the busiest rank's peak over one more step, as
live torch-allocated tensor bytes plus the engine arena's device bytes (CPU), or
torch.cuda.max_memory_allocated / max_memory_reserved plus the engine's device arena (GPU);
and per rank the model state by kind (exactly comparable with megalith_zero.estimate).
Rank 0 prints one line `GRIDRESULT {json}`.
"""

from __future__ import annotations

import json
import resource
import statistics
import sys
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from live_bytes import LiveBytes, engine_device_bytes, engine_reports

import megalith_comm as comm
from megalith import models
from megalith.booster import Booster


def build_model(cfg: dict[str, Any], device: torch.device) -> torch.nn.Module:
    model = models.create(cfg["preset"], device="meta", **cfg.get("overrides", {}))
    models.materialize(model, device=device, seed=0)
    layers = len(model.blocks)
    if cfg["ckpt"] > 0:
        # the first share of each pipeline rank's layers, as the cost model counts them
        per_stage = -(-layers // cfg["pp"])
        n = round(cfg["ckpt"] * per_stage)
        picked = [i for i in range(layers) if i % per_stage < n]
        model.set_activation_checkpointing(True, picked)
    return model


def make_plugin(cfg: dict[str, Any]) -> Any:
    from megalith.booster import plugin as P

    precision = cfg["precision"]
    sp = cfg.get("sp", 1)
    if cfg["tp"] > 1 or cfg["pp"] > 1 or sp > 1:
        kw: dict[str, Any] = dict(
            tp_size=cfg["tp"], pp_size=cfg["pp"], zero_stage=cfg["zero_stage"], precision=precision
        )
        if sp > 1:
            kw.update(
                enable_sequence_parallelism=True,
                sequence_parallelism_mode="all_to_all",
                sp_size=sp,
            )
        if cfg["pp"] > 1:
            style = {"1f1b": "1f1b", "interleaved": "interleaved", "zbv": "zbv"}[cfg["schedule"]]
            kw.update(num_microbatches=cfg["num_microbatches"], pp_style=style)
            if style != "1f1b":
                kw["num_model_chunks"] = 2
        return P.HybridParallelPlugin(**kw)
    stage, frac = cfg["zero_stage"], cfg["offload_fraction"]
    if stage == 0:
        return P.TorchDDPPlugin()
    if stage in (1, 2):
        return P.LowLevelZeroPlugin(stage=stage, precision=precision, cpu_offload=frac >= 1.0)
    return P.GeminiPlugin(precision=precision, offload_optim_frac=frac)


def _loss(out: Any) -> torch.Tensor:
    return out.loss if hasattr(out, "loss") else out[0]


class Stepper:
    """One optimizer step of the config: a pipeline's execute_pipeline, or micro-batches
    accumulated under no_sync then one step."""

    def __init__(self, cfg: dict[str, Any], booster: Booster, model: Any, opt: Any, vocab: int):
        self.cfg, self.booster, self.model, self.opt = cfg, booster, model, opt
        self.vocab = vocab
        # the ranks of one tp x sp group feed the same sequences
        group = max(1, cfg["tp"]) * cfg.get("sp", 1)
        self.gen = torch.Generator().manual_seed(1 + comm.get_world().rank // group)
        self.device = torch.device(cfg["device"])
        self.grad_bytes = 0  # the gradients' bytes at the last step's end, before zero_grad

    def _ids(self, rows: int) -> torch.Tensor:
        ids = torch.randint(0, self.vocab, (rows, self.cfg["seq_len"]), generator=self.gen)
        return ids.to(self.device)

    def __call__(self) -> float:
        cfg, b, m = self.cfg, self.cfg["micro_batch"], self.cfg["num_microbatches"]
        if cfg["pp"] > 1:
            ids = self._ids(b * m)
            batch = {"input_ids": ids, "labels": ids}
            out = self.booster.execute_pipeline(
                iter([batch]), self.model, lambda o, _: o.loss, self.opt, return_loss=True
            )
            loss = out["loss"]
        else:
            for i in range(m):
                ids = self._ids(b)
                last = i == m - 1
                ctx = nullcontext() if last else self.booster.no_sync(self.model, self.opt)
                with ctx:
                    loss = _loss(self.model(ids, labels=ids)) / m
                    self.booster.backward(loss, self.opt)
        self.opt.step()
        self.grad_bytes = _grad_bytes(self.model)
        self.opt.zero_grad()
        return float(loss.detach().float()) if loss is not None else float("nan")


def _grad_bytes(model: Any) -> int:
    module = model.unwrap() if hasattr(model, "unwrap") else model
    grads = {id(p.grad): p.grad for p in module.parameters() if p.grad is not None}
    return sum(g.numel() * g.element_size() for g in grads.values())


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()
    comm.barrier()


def _state_bytes(model: Any, opt: Any, arenas: list[Any], grads: int) -> dict[str, int]:
    """This rank's model state by kind: the engine's report when ZeRO holds it, else the
    tensors themselves (parameters, the gradients at the step's end, optimizer states;
    DDP's buckets apart)."""
    if arenas:
        return engine_device_bytes(arenas, peak=True) | {
            "gathered": sum(
                m.report().get("gathered", (0, 0))[1] for m in arenas if "gathered" in m.report()
            )
        }
    module = model.unwrap() if hasattr(model, "unwrap") else model
    seen: set[int] = set()
    params = 0
    for p in module.parameters():
        if id(p) not in seen:
            seen.add(id(p))
            params += p.numel() * p.element_size()
    inner = getattr(opt, "optim", opt)
    states = sum(
        t.numel() * t.element_size()
        for s in inner.state.values()
        for t in s.values()
        if isinstance(t, torch.Tensor) and t.dim() > 0
    )
    return {"params": params, "grads": grads, "optim_states": states}


def run(cfg: dict[str, Any]) -> dict[str, Any] | None:
    device = torch.device(cfg["device"])
    world = comm.init() if not comm.is_initialized() else comm.get_world()
    if device.type == "cuda":
        torch.cuda.set_device(world.rank % torch.cuda.device_count())
    torch.manual_seed(0)
    tracker = LiveBytes() if device.type == "cpu" else None
    with tracker or nullcontext():  # state allocated while building, boosting, first step
        model = build_model(cfg, device)
        vocab = model.config.vocab_size
        plugin = make_plugin(cfg)
        booster = Booster(plugin=plugin)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        model, opt, *_ = booster.boost(model, opt)
        step = Stepper(cfg, booster, model, opt, vocab)
        _sync(device)
        first = time.perf_counter()
        losses = [step()]
        _sync(device)
        first = time.perf_counter() - first
    times = []
    for i in range(cfg["warmup"] - 1 + cfg["steps"]):
        _sync(device)
        t0 = time.perf_counter()
        losses.append(step())
        _sync(device)
        if i >= cfg["warmup"] - 1:
            times.append(time.perf_counter() - t0)
    arenas = engine_reports(model, opt)
    for mem in arenas:
        mem.reset_peak()
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        step()
        torch.cuda.synchronize()
        torch_peak = torch.cuda.max_memory_allocated()
        reserved = torch.cuda.max_memory_reserved()
    else:
        with tracker:
            tracker.reset_peak()
            base = tracker.current
            step()
        torch_peak, reserved = tracker.peak, 0
    engine_peak = sum(engine_device_bytes(arenas, peak=True).values())
    mine = {
        "peak_bytes": torch_peak + engine_peak,
        "torch_peak_bytes": torch_peak,
        "torch_base_bytes": base,
        "engine_peak_bytes": engine_peak,
        "reserved_bytes": reserved,
        "rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "state": _state_bytes(model, opt, arenas, step.grad_bytes),
    }
    every = _gather(mine)
    if world.rank != 0:
        return None
    busiest = max(every, key=lambda r: r["peak_bytes"])
    return {
        "step_s": statistics.median(times),
        "step_times_s": times,
        "first_step_s": first,
        "losses": losses,
        **{k: busiest[k] for k in mine if k != "state"},
        "state_by_rank": [r["state"] for r in every],
        "peak_by_rank": [r["peak_bytes"] for r in every],
    }


def _gather(obj: Any) -> list[Any]:
    import torch.distributed as dist

    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def main() -> None:
    cfg = json.loads(sys.argv[1])
    if cfg["device"] == "cpu":
        torch.set_num_threads(1)
    result = run(cfg)
    if result is not None:
        print("GRIDRESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
