"""transformers' BERT and T5, sharded by their policies, against the unsharded model.

As models.py: each rank builds the same full model, keeps it as the reference and
shards a copy; both take AdamW steps on the same global batch (each data-parallel
rank its share, gradients averaged over dp). Losses, the first step's gradients and
the final weights (gathered to full shape) must agree within 1e-5 relative.
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass

import torch
from torch import nn

import megalith_comm as comm
from megalith.tensor_parallel import gather_full, shard_model
from tests.tensor_parallel.common import check, expect_value_error, mesh

VOCAB, SEQ, LABELS = 96, 8, 3


@dataclass(frozen=True)
class EncoderCase:
    model: str  # bert-mlm, bert-cls, bert, t5, t5-v1.1, t5-encoder
    dp: int = 1
    tp: int = 2
    sp: bool = False
    steps: int = 2

    def run(self, rank: int) -> tuple[list[str], float]:
        return run(rank, self)


def build(case: EncoderCase) -> nn.Module:
    import transformers as tf

    torch.manual_seed(0)
    if case.model.startswith("bert"):
        cfg = tf.BertConfig(
            vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
            intermediate_size=128, max_position_embeddings=SEQ, num_labels=LABELS,
            hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
        )  # fmt: skip
        kind = {"bert-mlm": "BertForMaskedLM", "bert-cls": "BertForSequenceClassification"}
        return getattr(tf, kind.get(case.model, "BertModel"))(cfg)
    v11 = case.model == "t5-v1.1"
    cfg = tf.T5Config(
        vocab_size=VOCAB, d_model=64, d_kv=16, d_ff=128, num_layers=2, num_heads=4,
        dropout_rate=0.0, relative_attention_num_buckets=8, decoder_start_token_id=0,
        feed_forward_proj="gated-gelu" if v11 else "relu",
        **({"tie_word_embeddings": False} if v11 else {}),
    )  # fmt: skip
    if case.model == "t5-encoder":
        return tf.T5EncoderModel(cfg)
    model = tf.T5ForConditionalGeneration(cfg)
    if v11:  # transformers 5 always ties; untie by hand for the untied lm_head path
        model.lm_head.weight = nn.Parameter(model.lm_head.weight.detach().clone())
    return model


def batch(case: EncoderCase, gen: torch.Generator) -> dict[str, torch.Tensor]:
    rows = 2 * case.dp
    ids = torch.randint(0, VOCAB, (rows, SEQ), generator=gen)
    mask = torch.ones(rows, SEQ, dtype=torch.long)
    mask[1::2, -3:] = 0  # padding in every second row (same count on every dp rank)
    out = {"input_ids": ids, "attention_mask": mask}
    if case.model == "bert-mlm":
        labels = torch.randint(0, VOCAB, (rows, SEQ), generator=gen)
        labels[:, ::2] = -100  # ignored positions, alike in every row
        out["labels"] = labels
    elif case.model == "bert-cls":
        out["labels"] = torch.randint(0, LABELS, (rows,), generator=gen)
    elif case.model in ("t5", "t5-v1.1"):
        out["labels"] = torch.randint(0, VOCAB, (rows, SEQ), generator=gen)
    return out


def loss_of(model: nn.Module, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
    out = model(**inputs)
    if "labels" in inputs:
        return out.loss
    # A fixed projection first: a (RMS) layer norm's output has a fixed mean square,
    # so h.square().mean() alone would leave only rounding noise as gradients.
    probe = torch.randn(out.last_hidden_state.shape[-1], generator=torch.Generator().manual_seed(7))
    loss = (out.last_hidden_state @ probe).square().mean()
    pooled = getattr(out, "pooler_output", None)
    return loss if pooled is None else loss + (pooled @ probe).square().mean()


def _noise_only(name: str) -> bool:
    """A key bias adds the same q . b_k to a row's scores, which softmax ignores: its
    exact gradient is zero and what is left is rounding noise (common.exact_entries)."""
    return name.endswith("attention.self.key.bias")


def ties(model: nn.Module) -> list[list[str]]:
    """The groups of names that share one parameter (embedding, decoder, lm_head, bias)."""
    groups: dict[int, list[str]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        groups.setdefault(id(p), []).append(name)
    return sorted(sorted(g) for g in groups.values() if len(g) > 1)


def check_layout(errors: list[str], model: nn.Module, ref: nn.Module, tp: int) -> None:
    if ties(model) != ties(ref):
        errors.append(f"tied parameters {ties(model)}, unsharded {ties(ref)}")
    local = sum(p.numel() for p in model.parameters())
    full = sum(p.numel() for p in ref.parameters())
    if not local < full * (1 + 1 / tp) / 2:  # all but norms, biases, position tables split
        errors.append(f"{local} parameters on a rank of {full}: not sharded over {tp}")


def run(rank: int, case: EncoderCase) -> tuple[list[str], float]:
    start = time.perf_counter()
    m = mesh(case.dp, case.tp)
    tp_group, dp_group = m.group("tp"), m.group("dp")
    ref = build(case)
    model = shard_model(copy.deepcopy(ref), tp_group, sequence_parallel=case.sp)
    ref.train()
    model.train()
    opt_ref = torch.optim.AdamW(ref.parameters(), lr=1e-3, weight_decay=0.1)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.1)
    gen = torch.Generator().manual_seed(5)
    errors: list[str] = []
    check_layout(errors, model, ref, case.tp)
    for step in range(case.steps):
        inputs = batch(case, gen)
        mine = {k: v.chunk(case.dp)[m.coord("dp")] for k, v in inputs.items()}
        loss_ref = loss_of(ref, inputs)
        loss_ref.backward()
        loss = loss_of(model, mine)
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
                want = ref_params[name].grad
                if _noise_only(name):
                    if full.norm() > 1e-6:
                        errors.append(f"grad {name}: norm {full.norm():.3g}, want ~0")
                else:
                    check(errors, f"grad {name}", full, want)
        opt_ref.step()
        opt.step()
        opt_ref.zero_grad()
        opt.zero_grad()
    ref_params = dict(ref.named_parameters())
    for name, p in model.named_parameters():
        if not _noise_only(name):
            check(errors, f"weight {name}", gather_full(p, tp_group), ref_params[name].detach())
    return errors, time.perf_counter() - start


@dataclass(frozen=True)
class EncoderErrorCase:
    """Sizes tp cannot split fail on every rank before any collective, naming the
    numbers, and leave the model untouched; an unknown model lists BERT and T5."""

    tp: int = 2

    def run(self, rank: int) -> tuple[list[str], float]:
        import transformers as tf

        start = time.perf_counter()
        group = mesh(1, self.tp).group("tp")
        tp, issued = str(self.tp), group.issued
        errors: list[str] = []
        heads = 3 if self.tp == 2 else 6  # 48 features over either
        d_ff = 65 if self.tp == 2 else 66

        def bert(**kw):
            base = dict(vocab_size=VOCAB, hidden_size=48, num_hidden_layers=1,
                        num_attention_heads=4, intermediate_size=64, max_position_embeddings=SEQ)  # fmt: skip
            return tf.BertForMaskedLM(tf.BertConfig(**{**base, **kw}))

        def t5(**kw):
            base = dict(vocab_size=VOCAB, d_model=48, d_kv=8, d_ff=64, num_layers=1, num_heads=4)
            return tf.T5ForConditionalGeneration(tf.T5Config(**{**base, **kw}))

        m = bert(num_attention_heads=heads)
        expect_value_error(
            errors, "bert heads", lambda: shard_model(m, group), "heads", f"({heads})", tp
        )
        if not isinstance(m.bert.encoder.layer[0].attention.self.query, nn.Linear):
            errors.append("a failed shard_model changed the BERT model")
        expect_value_error(
            errors, "bert vocab", lambda: shard_model(bert(vocab_size=95), group), "95", tp
        )
        expect_value_error(errors, "bert d_ff", lambda: shard_model(bert(intermediate_size=d_ff), group), str(d_ff), tp)  # fmt: skip
        m = t5(num_heads=heads)
        expect_value_error(
            errors, "t5 heads", lambda: shard_model(m, group), "heads", f"({heads})", tp
        )
        if not isinstance(m.shared, nn.Embedding):
            errors.append("a failed shard_model changed the T5 model")
        expect_value_error(
            errors, "t5 vocab", lambda: shard_model(t5(vocab_size=95), group), "95", tp
        )
        expect_value_error(errors, "t5 d_ff", lambda: shard_model(t5(d_ff=d_ff), group), str(d_ff), tp)  # fmt: skip
        expect_value_error(errors, "unsupported", lambda: shard_model(nn.Linear(2, 2), group),
                "BertForMaskedLM", "T5ForConditionalGeneration")  # fmt: skip
        if group.issued != issued:
            errors.append(f"{group.issued - issued} collectives issued before the errors")
        return errors, time.perf_counter() - start
