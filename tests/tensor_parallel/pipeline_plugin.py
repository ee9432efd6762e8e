"""HybridParallelPlugin with pp_size > 1 through Booster.execute_pipeline, against the
whole transformers model trained in one process on the whole batch."""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass

import torch

import megalith_comm as comm
from megalith.booster import Booster
from megalith.booster.plugin import HybridParallelPlugin
from megalith.tensor_parallel import gather_full
from tests.tensor_parallel.common import check, exact_entries

VOCAB, SEQ = 64, 8


def build(family: str, layers: int) -> torch.nn.Module:
    import transformers as tf

    torch.manual_seed(0)
    if family == "gpt2":
        cfg = tf.GPT2Config(
            vocab_size=VOCAB, n_positions=SEQ, n_embd=32, n_layer=layers, n_head=4,
            resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
        )  # fmt: skip
        return tf.GPT2LMHeadModel(cfg)
    cfg = tf.LlamaConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=SEQ,
        attn_implementation="sdpa",
    )  # fmt: skip
    return tf.LlamaForCausalLM(cfg)


def criterion(outputs, inputs):  # ColossalAI's pipeline criterion shape
    return outputs.loss


@dataclass(frozen=True)
class PipePluginCase:
    family: str = "gpt2"
    tp: int = 1
    pp: int = 2
    style: str = "1f1b"
    chunks: int = 1
    zero_stage: int = 0
    precision: str = "fp32"
    max_norm: float = 0.0
    sp: bool = False
    microbatches: int = 3
    layers: int = 4
    steps: int = 2
    checkpoint: bool = False  # save, then load as a whole model and under pp 2 x dp 2
    outputs: bool = False  # return_outputs: the last stage's logits equal the whole model's

    def run(self, rank: int) -> tuple[list[str], float]:
        start = time.perf_counter()
        ref = build(self.family, self.layers)
        model = copy.deepcopy(ref)
        plugin = HybridParallelPlugin(
            tp_size=self.tp,
            pp_size=self.pp,
            pp_style=self.style,
            num_model_chunks=self.chunks,
            num_microbatches=self.microbatches,
            zero_stage=self.zero_stage,
            precision=self.precision,
            max_norm=self.max_norm,
            enable_sequence_parallelism=self.sp,
            parallel_output=False,  # return_outputs compares full logits
        )
        booster = Booster(plugin=plugin)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.1)
        model, opt, *_ = booster.boost(model, opt)
        opt_ref = torch.optim.AdamW(ref.parameters(), lr=1e-3, weight_decay=0.1)
        dp_rank, dp = plugin.dp_rank_size
        gen = torch.Generator().manual_seed(11)
        errors: list[str] = []
        loose = self.precision != "fp32"
        tol = 2e-2 if loose else 1e-5
        for step in range(self.steps):
            ids = torch.randint(0, VOCAB, (2 * self.microbatches * dp, SEQ), generator=gen)
            ref_out = ref(ids, labels=ids)
            want = ref_out.loss
            want.backward()
            if self.max_norm:
                torch.nn.utils.clip_grad_norm_(ref.parameters(), self.max_norm)
            opt_ref.step()
            opt_ref.zero_grad()
            mine = ids.chunk(dp)[dp_rank]
            batch = {"input_ids": mine, "labels": mine}
            if step == 0:  # a list (not an iterator) would give the same batch every step
                try:
                    booster.execute_pipeline([batch], model, criterion, opt)
                    errors.append("execute_pipeline took a list")
                except TypeError as exc:
                    if "iter(dataloader)" not in str(exc):
                        errors.append(f"execute_pipeline([batch]): {exc}")
            out = booster.execute_pipeline(
                iter([batch]), model, criterion, opt, return_loss=True, return_outputs=self.outputs
            )
            if self.outputs:
                check_outputs(out["outputs"], ref_out.logits.chunk(dp)[dp_rank], plugin, errors)
            loss = out["loss"].detach().reshape(1).float()
            comm.all_reduce(loss, op="avg", group=plugin.mesh.group("dp"))
            check(errors, f"loss at step {step}", loss[0], want.detach(), 5e-3 if loose else 1e-5)
            opt.step()
            opt.zero_grad()
        ref_params = dict(ref.named_parameters())
        mine = plugin.local_named_parameters(model)
        if not mine or len(mine) >= len(ref_params):
            errors.append(f"{len(mine)} of {len(ref_params)} parameters on this rank")
        tp_group = plugin.mesh.group("tp")
        trained = {}
        for name, p in mine.items():
            full, want = gather_full(p, tp_group), ref_params[name].detach()
            trained[name] = full.detach()
            keep = exact_entries(name, want)
            check(errors, f"weight {name}", full[keep].float(), want[keep], tol)
        if self.checkpoint:
            check_reload(booster, model, trained, self.family, self.layers, errors)
        return errors, time.perf_counter() - start


def check_outputs(outputs, want: torch.Tensor, plugin, errors: list[str]) -> None:
    """Outputs on the ranks of the last stage only, equal to the whole model's logits for
    this rank's rows (the micro-batches put back in order)."""
    has = torch.tensor([float(outputs is not None)])
    comm.all_reduce(has)
    last_stage_ranks = plugin.mesh.group("dp").size * plugin.mesh.group("tp").size
    if int(has) != last_stage_ranks:
        errors.append(f"outputs on {int(has)} ranks, want {last_stage_ranks} (the last stage's)")
    if outputs is not None:
        check(errors, "outputs.logits", outputs.logits.float(), want.detach())


def check_reload(booster, model, trained, family: str, layers: int, errors: list[str]) -> None:
    """The files hold the whole trained model (every rank's stages, full tensors: read back
    into a plain model) and load into another layout (pp 2 x dp 2, no tp)."""
    import os
    import shutil
    import tempfile

    from safetensors.torch import load_file

    path = os.path.join(tempfile.gettempdir(), f"megalith-pp-ckpt-{os.getppid()}")
    booster.save_model(model, path, shard=True, size_per_shard=1)
    files = sorted(f for f in os.listdir(path) if f.endswith(".safetensors"))
    saved = {k: v for f in files for k, v in load_file(os.path.join(path, f)).items()}
    plain = build(family, layers)
    result = plain.load_state_dict(saved, strict=False)
    names = {n for n, _ in plain.named_parameters()}
    if [k for k in result.missing_keys if k in names] or result.unexpected_keys:
        errors.append(
            f"files: missing {result.missing_keys[:4]}, extra {result.unexpected_keys[:4]}"
        )
    for name, full in trained.items():
        check(errors, f"saved {name}", saved[name], full, 1e-7)
    plugin = HybridParallelPlugin(tp_size=1, pp_size=2, num_microbatches=2)
    other = Booster(plugin=plugin)
    fresh, *_ = other.boost(build(family, layers))
    other.load_model(fresh, path)
    for name, p in plugin.local_named_parameters(fresh).items():
        check(errors, f"reloaded {name}", p.detach(), saved[name], 1e-7)
    comm.barrier()
    if comm.get_world().rank == 0:
        shutil.rmtree(path, ignore_errors=True)
