"""Whole models, sharded by their policy, against the unsharded model in one process.

Each rank builds the same full model (same seed), keeps an unsharded copy as the
reference and shards the other. Both train a few AdamW steps on the same global
batch: the reference on all of it, each data-parallel rank on its share, with
gradients averaged over dp. Losses, the first step's gradients and the final
weights (gathered from the shards) must agree within 1e-5 relative.
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass

import torch
from torch import nn

import megalith_comm as comm
from megalith.tensor_parallel import gather_full, shard_model, vocab_parallel_causal_lm_loss
from tests.tensor_parallel.common import check, exact_entries, grid_failures, mesh

VOCAB, SEQ = 64, 8


@dataclass(frozen=True)
class ModelCase:
    source: str  # megalith, hf
    family: str  # gpt2, llama, mistral, qwen2
    dp: int = 1
    tp: int = 2
    sp: bool = False
    gather_logits: bool = True
    kv_heads: int = 2
    checkpointing: bool = False
    steps: int = 2

    def run(self, rank: int) -> tuple[list[str], float]:
        return run(rank, self)


def build(case: ModelCase) -> nn.Module:
    torch.manual_seed(0)
    if case.source == "megalith":
        import megalith.models as mm

        if case.family == "gpt2":
            cfg = mm.GPTConfig(
                vocab_size=VOCAB, max_seq_len=SEQ, d_model=32, n_layers=2, n_heads=4, d_ff=64
            )
        else:
            cfg = mm.LlamaConfig(
                vocab_size=VOCAB,
                max_seq_len=SEQ,
                d_model=32,
                n_layers=2,
                n_heads=4,
                d_ff=48,
                n_kv_heads=case.kv_heads,
            )
        return mm.create(cfg, device="cpu", seed=0)
    import transformers as tf

    if case.family == "gpt2":
        cfg = tf.GPT2Config(
            vocab_size=VOCAB, n_positions=SEQ, n_embd=32, n_layer=2, n_head=4,
            resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
        )  # fmt: skip
        return tf.GPT2LMHeadModel(cfg)
    kind = {"llama": "Llama", "mistral": "Mistral", "qwen2": "Qwen2", "qwen3": "Qwen3"}[case.family]
    extra = {"head_dim": 8} if case.family == "qwen3" else {}
    cfg = getattr(tf, f"{kind}Config")(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=case.kv_heads, max_position_embeddings=SEQ,
        attn_implementation="sdpa", **extra,
    )  # fmt: skip
    return getattr(tf, f"{kind}ForCausalLM")(cfg)


def loss_of(model: nn.Module, ids: torch.Tensor, case: ModelCase, group) -> torch.Tensor:
    if not case.gather_logits and group is not None:
        out = model(ids) if case.source == "megalith" else model(input_ids=ids).logits
        return vocab_parallel_causal_lm_loss(out, ids, group)
    if case.source == "megalith":
        return model(ids, labels=ids).loss
    return model(input_ids=ids, labels=ids).loss


def run_case(rank: int, case) -> tuple[list[str], float]:
    """The grid function: any case with a run(rank) method."""
    torch.set_num_threads(1)  # two ranks per core on the CI machine
    return case.run(rank)


def run_cases(cases: list, world_size: int, timeout: float = 180) -> None:
    """Runs every case on world_size ranks (one process group for all); prints each
    case's time; fails with the first errors of every rank of every case."""
    from megalith.testing import run_grid

    results = run_grid(run_case, cases, world_size, timeout=timeout)
    for case, per_rank in zip(cases, results):
        print(f"{case}: {max(t for _, t in per_rank):.2f} s")
    failures = grid_failures(cases, results)
    assert not failures, "\n".join(failures)


def run(rank: int, case: ModelCase) -> tuple[list[str], float]:
    start = time.perf_counter()
    m = mesh(case.dp, case.tp)
    tp_group, dp_group = m.group("tp"), m.group("dp")
    ref = build(case)
    model = shard_model(
        copy.deepcopy(ref), tp_group, sequence_parallel=case.sp, gather_logits=case.gather_logits
    )
    ref.train()
    model.train()
    if case.checkpointing:  # blocks recomputed in backward, their collectives included
        if case.source == "megalith":
            model.set_activation_checkpointing(True)
        else:
            model.gradient_checkpointing_enable({"use_reentrant": False})
    opt_ref = torch.optim.AdamW(ref.parameters(), lr=1e-3, weight_decay=0.1)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.1)
    gen = torch.Generator().manual_seed(5)
    errors: list[str] = []
    for step in range(case.steps):
        ids = torch.randint(0, VOCAB, (2 * case.dp, SEQ), generator=gen)
        mine = ids.chunk(case.dp)[m.coord("dp")]
        loss_ref = loss_of(ref, ids, case, None)
        loss_ref.backward()
        loss = loss_of(model, mine, case, tp_group)
        loss.backward()
        for p in model.parameters():
            if p.grad is not None:
                comm.all_reduce(p.grad, op="avg", group=dp_group)
        mean_loss = loss.detach().clone()
        comm.all_reduce(mean_loss, op="avg", group=dp_group)
        check(errors, f"step {step} loss", mean_loss, loss_ref)
        if step == 0:
            ref_params = dict(ref.named_parameters())
            for name, p in model.named_parameters():
                full = gather_full(p.grad, tp_group, getattr(p, "tp_spec", None))
                check(errors, f"grad {name}", full, ref_params[name].grad)
        opt_ref.step()
        opt.step()
        opt_ref.zero_grad()
        opt.zero_grad()
    ref_params = dict(ref.named_parameters())
    for name, p in model.named_parameters():
        full, want = gather_full(p, tp_group), ref_params[name].detach()
        keep = exact_entries(name, want)
        check(errors, f"weight {name}", full[keep], want[keep])
    return errors, time.perf_counter() - start
