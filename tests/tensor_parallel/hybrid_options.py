"""HybridParallelPlugin's gradient_checkpoint_config and cpu_offload, against the whole
model trained in one process on the whole batch (fp32: within 1e-5 relative).

SGD with momentum, not AdamW: Adam divides each gradient by its own magnitude, so
entries whose exact gradient is ~0 (a fresh LayerNorm bias, say) take lr-sized
steps decided by summation-order noise, and no two layouts agree on them."""

from __future__ import annotations

import copy
import math
import time
from dataclasses import dataclass

import torch

import megalith_comm as comm
from megalith.booster import Booster, GradientCheckpointConfig
from megalith.booster.plugin import HybridParallelPlugin
from megalith.tensor_parallel import gather_full
from tests.tensor_parallel.common import check, exact_entries
from tests.tensor_parallel.pipeline_plugin import SEQ, VOCAB, build, criterion


def build_any(family: str, layers: int) -> torch.nn.Module:
    if family == "megalith-gpt":
        from megalith import models

        torch.manual_seed(0)
        return models.create(
            "gpt-tiny", device="cpu", vocab_size=VOCAB, max_seq_len=SEQ, n_layers=layers
        )
    return build(family, layers)


def count_layer_runs(model: torch.nn.Module) -> dict[str, int]:
    """Counts every decoder layer's MLP calls: a checkpointed layer runs its MLP twice a step."""
    counts: dict[str, int] = {}
    for name, mod in model.named_modules():
        if name.endswith(".mlp") or name.endswith(".ffn"):
            counts[name] = 0

            def hook(_m, _a, key=name):
                counts[key] += 1

            # a pre-hook: checkpoint's recompute stops early, inside the layer's last
            # module, once it has every saved tensor back, so a forward hook would not fire
            mod.register_forward_pre_hook(hook)
    assert counts, "no MLP modules found to count"
    return counts


@dataclass(frozen=True)
class OptionsCase:
    family: str = "gpt2"
    tp: int = 2
    pp: int = 1
    zero_stage: int = 0
    cpu_offload: bool = False
    ratio: float = 0.0  # gradient_checkpointing_ratio; 0: off
    layers: int = 4
    steps: int = 3

    def run(self, rank: int) -> tuple[list[str], float]:
        start = time.perf_counter()
        ref = build_any(self.family, self.layers)
        model = copy.deepcopy(ref)
        ref.train()
        model.train()
        plugin = HybridParallelPlugin(
            tp_size=self.tp,
            pp_size=self.pp,
            num_microbatches=2 if self.pp > 1 else None,
            zero_stage=self.zero_stage,
            cpu_offload=self.cpu_offload,
            gradient_checkpoint_config=GradientCheckpointConfig(self.ratio) if self.ratio else None,
        )
        booster = Booster(plugin=plugin)
        opt = torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9, weight_decay=0.01)
        counts = count_layer_runs(model)  # by the whole model's names, before any cut
        model, opt, *_ = booster.boost(model, opt)
        opt_ref = torch.optim.SGD(ref.parameters(), lr=0.5, momentum=0.9, weight_decay=0.01)
        dp_rank, dp = plugin.dp_rank_size
        gen = torch.Generator().manual_seed(3)
        errors: list[str] = []
        for step in range(self.steps):
            ids = torch.randint(0, VOCAB, (4 * dp, SEQ), generator=gen)
            want = ref(ids, labels=ids)
            want = want.loss if hasattr(want, "loss") else want[0]
            want.backward()
            opt_ref.step()
            opt_ref.zero_grad()
            mine = ids.chunk(dp)[dp_rank]
            if self.pp > 1:
                batch = {"input_ids": mine, "labels": mine}
                out = booster.execute_pipeline(iter([batch]), model, criterion, opt)
                loss = out["loss"].detach().reshape(1).float()
            else:
                out = model(mine, labels=mine)
                loss = out.loss if hasattr(out, "loss") else out[0]
                booster.backward(loss, opt)
                loss = loss.detach().reshape(1).float()
            comm.all_reduce(loss, op="avg", group=plugin.mesh.group("dp"))
            check(errors, f"loss at step {step}", loss[0], want.detach())
            opt.step()
            opt.zero_grad()
        ran = sorted((k, v) for k, v in counts.items() if v)
        k = math.ceil(self.ratio * self.layers)  # checkpointed layers, as the plugin counts
        calls = self.steps * (2 if self.pp > 1 else 1)  # a pipeline runs 2 micro-batches a step
        want_runs = [2 * calls if i < k else calls for i in range(self.layers)]
        got = {int(next(p for p in name.split(".") if p.isdigit())): v for name, v in ran}
        for i, v in got.items():
            if v != want_runs[i]:
                errors.append(
                    f"layer {i}: MLP ran {v} times in {self.steps} steps, want {want_runs[i]}"
                )
        if self.pp == 1 and len(got) != self.layers:
            errors.append(f"{len(got)} of {self.layers} layers ran")
        if self.cpu_offload:  # every master and optimizer state on the host, none on the device
            report = opt.zero_optimizer.chunks[0].memory.report()
            for kind in ("master", "optim_states"):
                if report[kind].current_bytes or not report[f"{kind}@host"].current_bytes:
                    errors.append(
                        f"cpu_offload: {kind} {report[kind]}, on host {report[f'{kind}@host']}"
                    )
        ref_params = dict(ref.named_parameters())
        tp_group = plugin.mesh.group("tp")
        for name, p in plugin.local_named_parameters(model).items():
            full, want_p = gather_full(p, tp_group), ref_params[name].detach()
            keep = exact_entries(name, want_p)
            check(errors, f"weight {name}", full[keep].float(), want_p[keep])
        return errors, time.perf_counter() - start
