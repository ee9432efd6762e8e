"""`megalith train --data DIR` with a Hugging Face datasets folder (issue 19, deliverable 5):
a DatasetDict that save_to_disk wrote (a "train" split and a "test" split of other text)
trains 3 steps of a tiny transformers Llama on one CPU rank. The tokens the run read are
the tokenizer's ids of the train rows' text column joined by newlines: each step's loss is
transformers' own loss on the windows drawn from those ids alone (the test split, the
other column and the row order of anything else would give other numbers)."""

from __future__ import annotations

import json

import pytest
import torch

from megalith.testing import run_grid
from tests.cli import finetune_checkpoints as fc

datasets = pytest.importorskip(
    "datasets", reason="datasets is not installed (pip install datasets): no folder to read"
)
pytest.importorskip("transformers")

STEPS, BATCH, LR = 3, 2, 1e-2


def _write(path, rows: int = 40) -> list[str]:
    """The train split's texts (a few hundred characters of the built-in corpus each)."""
    body = fc.text(rows * 600)
    train = [body[i * 300 : (i + 1) * 300] for i in range(rows)]
    other = [body[-(i + 1) * 300 :][:300] for i in range(rows)]
    datasets.DatasetDict(
        {
            "train": datasets.Dataset.from_dict({"body": train, "n": list(range(rows))}),
            "test": datasets.Dataset.from_dict({"body": other, "n": list(range(rows))}),
        }
    ).save_to_disk(str(path))
    return train


def _windows(ids: torch.Tensor, step: int) -> torch.Tensor:
    """The batch of a step (one rank), drawn as the loop draws it (--seq-len equal to the
    context: windows of CONTEXT tokens), from ids the test built."""
    from megalith.train import corpus

    seq, n = fc.CONTEXT - 1, 20 * fc.CONTEXT
    cut = max(len(ids) - max(len(ids) // 20, n // 2), n // 2)  # corpus.load's train part
    train = ids[:cut]
    return corpus.batch(train, BATCH, seq, corpus.batch_generator(0, step, 0, "train"))


@pytest.mark.timeout(200)
def test_train_reads_a_datasets_folder(tmp_path, monkeypatch):
    import transformers

    torch.set_num_threads(1)
    ckpt = fc.cached_model("llama")
    texts = _write(tmp_path / "ds")
    argv = [
        "--from-pretrained", str(ckpt), "--tokenizer", str(ckpt), "--data", str(tmp_path / "ds"),
        "--text-field", "body", "--seq-len", str(fc.CONTEXT), "--batch-size", str(BATCH),
        "--steps", str(STEPS), "--eval-every", str(STEPS), "--save-every", str(STEPS),
        "--eval-batches", "1", "--lr", str(LR), "--warmup", "1", "--sample-tokens", "0",
        "--plugin", "ddp", "--nproc", "1", "--out", str(tmp_path / "runs"), "--name", "ds",
    ]  # fmt: skip
    run_grid(fc.train_ranks, [fc.rank_argv(argv, monkeypatch)], 1, timeout=180)

    rows = [
        json.loads(x) for x in (tmp_path / "runs" / "ds" / "metrics.jsonl").read_text().splitlines()
    ]
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1)), rows
    tok = transformers.AutoTokenizer.from_pretrained(str(ckpt))
    ids = torch.tensor(tok.encode("\n".join(texts), add_special_tokens=False), dtype=torch.int32)
    want = _reference(ckpt, [_windows(ids, s) for s in range(1, STEPS + 1)])
    got = [r["loss"] for r in rows]
    assert got == pytest.approx(want, rel=2e-5), (got, want)


def _reference(ckpt, batches) -> list[float]:
    """Plain transformers on one process, the run's full fine-tune: AdamW (betas 0.9,
    0.95, decay 0.1 on matrices only), one warm-up step then cosine to a tenth, clipping to norm 1."""
    import math

    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(str(ckpt), dtype=torch.float32)
    params = list(model.parameters())
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": 0.1},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    opt = torch.optim.AdamW(groups, lr=LR, betas=(0.9, 0.95))

    def factor(step):
        if step < 1:
            return 1.0
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, (step - 1) / (STEPS - 1))))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, factor)
    losses = []
    for ids in batches:
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad()
        sched.step()
        losses.append(float(loss.detach()))
    return losses
