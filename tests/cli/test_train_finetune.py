"""`megalith train --from-pretrained` (issue 19, deliverable 5): a tiny Llama that
transformers' save_pretrained wrote, with its tokenizer, fine-tuned on 2 CPU ranks with
LoRA (DDP) and in full (Gemini) at --seq-len equal to its context, on a .jsonl file.
Checked against plain transformers + peft on one process: the losses step by step, the
adapter peft writes, the full fine-tune's checkpoint as transformers loads it. Bad
options fail before any rank starts, in one line."""

from __future__ import annotations

import json
import sys

import pytest
import torch

from megalith.testing import run_grid
from tests.cli import finetune_checkpoints as fc

pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

STEPS, BATCH, LR = 3, 2, 1e-2


def _common(ckpt, data, out) -> list[str]:
    return [
        "--from-pretrained", str(ckpt), "--tokenizer", str(ckpt), "--data", str(data),
        "--seq-len", str(fc.CONTEXT), "--batch-size", str(BATCH), "--steps", str(STEPS),
        "--eval-every", str(STEPS), "--save-every", str(STEPS), "--eval-batches", "1",
        "--warmup", "1", "--lr", str(LR), "--sample-tokens", "4", "--out", str(out),
    ]  # fmt: skip


def _batches(ckpt, data) -> tuple[list[torch.Tensor], torch.Tensor, list[int]]:
    """The global batch of each step (both ranks' windows), the validation batch, as the
    loop draws them (--seq-len equal to the context: windows of CONTEXT tokens), and the
    prompt of the samples printed at each evaluation."""
    from megalith.train import corpus, tokenize

    text = corpus.load(str(data), 20 * (fc.CONTEXT + 1), tokenize.load(str(ckpt)))
    seq = fc.CONTEXT - 1

    def draw(split, tokens, step):
        return torch.cat(
            [
                corpus.batch(tokens, BATCH, seq, corpus.batch_generator(0, step, r, split))
                for r in range(2)
            ]
        )

    steps = [draw("train", text.train, s) for s in range(1, STEPS + 1)]
    return steps, draw("val", text.val, 0), text.val[:16].tolist()


def _rows(run) -> list[dict]:
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]


def _reference_lora(ckpt, batches) -> tuple[list[float], dict[str, torch.Tensor]]:
    """Plain peft on one process: AdamW as the run's (betas 0.9, 0.95, decay 0.1, the
    warm-up then cosine to a tenth), clipping to norm 1."""
    import math

    import transformers

    torch.manual_seed(0)
    base = transformers.AutoModelForCausalLM.from_pretrained(str(ckpt), dtype=torch.float32)
    config = peft.LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, task_type="CAUSAL_LM")
    model = peft.get_peft_model(base, config)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=LR, betas=(0.9, 0.95), weight_decay=0.1)

    def factor(step):
        if step < 1:
            return 1.0
        t = min(1.0, (step - 1) / (STEPS - 1))
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * t))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, factor)
    losses = []
    for ids in batches:
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad()
        sched.step()
        losses.append(float(loss.detach()))
    return losses, peft.get_peft_model_state_dict(model)


@pytest.mark.timeout(300)
def test_lora_and_full_finetune_against_transformers(tmp_path, monkeypatch):
    import transformers
    from safetensors.torch import load_file

    ckpt = fc.cached_model("llama")
    data = fc.write_jsonl(tmp_path / "notes.jsonl")
    common = _common(ckpt, data, tmp_path / "runs")
    lora = fc.rank_argv([*common, "--plugin", "ddp", "--lora", "4", "--name", "lora"], monkeypatch)
    full = fc.rank_argv([*common, "--plugin", "gemini", "--name", "full"], monkeypatch)
    printed = run_grid(fc.train_ranks, [lora, full], 2, timeout=240)

    batches, val, prompt = _batches(ckpt, data)
    want_losses, want_adapter = _reference_lora(ckpt, batches)
    rows = _rows(tmp_path / "runs" / "lora")
    got = [r["loss"] for r in rows]
    assert got == pytest.approx(want_losses, rel=2e-5), (got, want_losses)

    adapter = tmp_path / "runs" / "lora" / "adapter"
    saved = load_file(str(adapter / "adapter_model.safetensors"))
    assert set(saved) == set(want_adapter)
    for name, tensor in want_adapter.items():
        torch.testing.assert_close(saved[name], tensor, rtol=1e-4, atol=1e-6, msg=name)
    assert any(float(t.abs().max()) > 0 for n, t in saved.items() if "lora_B" in n)
    base = transformers.AutoModelForCausalLM.from_pretrained(str(ckpt), dtype=torch.float32)
    loaded = peft.PeftModel.from_pretrained(base, str(adapter)).eval()
    with torch.no_grad():
        val_loss = float(loaded(input_ids=val, labels=val).loss)
    assert rows[-1]["val_loss"] == pytest.approx(val_loss, rel=2e-5)
    # the sample printed at the evaluation (rank 0, one line): the tuned model's greedy text
    from megalith.train.generate import generate, one_line

    tok = transformers.AutoTokenizer.from_pretrained(str(ckpt))
    new = generate(loaded, prompt, 4, context=fc.CONTEXT)
    lines = [x for x in printed[0][0].splitlines() if "sample @" in x]
    assert len(lines) == 1 and lines[0].endswith(f">> {one_line(tok.decode(new), 80)}"), lines
    assert "sample @" not in printed[0][1]

    # the full fine-tune: the first loss is the pretrained model's own; its last
    # checkpoint is a transformers model, the one the run validated
    full_rows = _rows(tmp_path / "runs" / "full")
    fresh = transformers.AutoModelForCausalLM.from_pretrained(str(ckpt), dtype=torch.float32)
    with torch.no_grad():
        first = float(fresh(input_ids=batches[0], labels=batches[0]).loss)
    assert full_rows[0]["loss"] == pytest.approx(first, rel=2e-5)
    model_dir = tmp_path / "runs" / "full" / "checkpoints" / f"step_{STEPS:06d}" / "model"
    tuned = transformers.AutoModelForCausalLM.from_pretrained(str(model_dir)).eval()
    with torch.no_grad():
        tuned_val = float(tuned(input_ids=val, labels=val).loss)
    assert full_rows[-1]["val_loss"] == pytest.approx(tuned_val, rel=2e-5)
    moved = max(
        float((a - b).detach().abs().max()) for a, b in zip(tuned.parameters(), fresh.parameters())
    )
    assert moved > 1e-4, "the full fine-tune left every weight where it was"


def _fails(argv, monkeypatch, capsys) -> str:
    """The one line `megalith train ARGV` exits with, before any rank starts."""
    from megalith.cli import main as cli_main
    from megalith.cli import train as cli_train

    def no_ranks(nproc):
        raise AssertionError("the ranks were about to start")

    monkeypatch.setattr(cli_train, "_ranks", no_ranks)
    with pytest.raises(SystemExit) as e:
        cli_main.main(["train", *argv])
    message = str(e.value.code) if not isinstance(e.value.code, int) else capsys.readouterr().err
    assert message.count("\n") <= 1 and "Traceback" not in message, message
    return message


def test_bad_options_fail_before_any_rank(tmp_path, monkeypatch, capsys):
    ckpt = fc.cached_model("llama")
    small = tmp_path / "small-vocab"  # a model whose vocabulary is smaller than bytes'
    small.mkdir()
    config = json.loads((ckpt / "config.json").read_text())
    (small / "config.json").write_text(json.dumps({**config, "vocab_size": 200}))
    (small / "model.safetensors").symlink_to(ckpt / "model.safetensors")
    no_field = tmp_path / "bad.jsonl"
    no_field.write_text('{"body": "x"}\n')
    dataset = tmp_path / "ds"
    dataset.mkdir()
    (dataset / "dataset_info.json").write_text("{}")
    (dataset / "state.json").write_text("{}")
    pre = ["--from-pretrained", str(ckpt), "--tokenizer", str(ckpt), "--out", str(tmp_path)]
    pre += ["--seq-len", str(fc.CONTEXT)]
    cases = [
        (["--lora", "4"], "pass --from-pretrained DIR"),
        (["--lora-alpha", "8"], "pass --lora too"),
        (["--from-pretrained", str(tmp_path / "nowhere")], "no such directory"),
        ([*pre[:-2], "--seq-len", str(fc.CONTEXT + 1)], f"pass --seq-len {fc.CONTEXT} or less"),
        ([*pre, "--model", "gpt-small"], "leave --model out"),
        ([*pre, "--lora", "4", "--lora-targets", "nope_proj"], "--lora-targets nope_proj"),
        ([*pre, "--lora", "0"], "expected a rank >= 1"),
        (["--from-pretrained", str(small), "--seq-len", "8"], "pass --tokenizer DIR"),
        ([*pre, "--data", str(no_field)], "pass --text-field NAME"),
        ([*pre, "--sample-tokens", "-1"], "expected >= 0"),
        (["--tokenizer", str(tmp_path / "nowhere")], "no such directory"),
    ]
    if "datasets" not in sys.modules:
        try:
            import datasets  # noqa: F401
        except ImportError:
            cases.append(([*pre, "--data", str(dataset)], "pip install datasets"))
    for argv, words in cases:
        message = _fails(argv, monkeypatch, capsys)
        assert words in message, (argv, message)
    monkeypatch.setitem(sys.modules, "peft", None)  # as where peft is not installed
    assert "pip install peft" in _fails([*pre, "--lora", "4"], monkeypatch, capsys)


def test_tokenizer_and_data_formats(tmp_path):
    """.jsonl records and a folder of text and .jsonl files give the tokenizer's ids of
    their texts; --text-field picks the field."""
    from megalith.train import corpus, tokenize

    ckpt = fc.cached_model("llama")
    tok = tokenize.load(str(ckpt))
    assert tok.vocab_size == fc.VOCAB
    notes = fc.write_jsonl(tmp_path / "notes.jsonl", records=8, field="body")
    texts = [json.loads(x)["body"] for x in notes.read_text().splitlines()]
    got = corpus.load(str(notes), 100, tok, text_field="body")
    assert got.vocab == fc.VOCAB and got.unit == "token"
    want = torch.tensor(tok.encode("\n".join(texts)), dtype=torch.int32)
    assert torch.equal(torch.cat([got.train, got.val]), want)
    folder = tmp_path / "folder"
    folder.mkdir()
    (folder / "a.txt").write_text(texts[0])
    (folder / "b.jsonl").write_text(json.dumps({"text": texts[1]}) + "\n")
    both = corpus.load(str(folder), 50)  # bytes: a.txt, a newline, b's text
    raw = bytes(torch.cat([both.train, both.val]).tolist())
    assert raw == (texts[0] + "\n" + texts[1]).encode()
    assert tokenize.ByteTokenizer().decode(tokenize.ByteTokenizer().encode("é!")) == "é!"


def test_a_datasets_folder(tmp_path):
    """What Dataset.save_to_disk wrote: its text column (--text-field), as one text."""
    datasets = pytest.importorskip("datasets")
    from megalith.train import corpus

    texts = [fc.text(3000)[i * 300 : (i + 1) * 300] for i in range(10)]
    datasets.Dataset.from_dict({"body": texts, "n": list(range(10))}).save_to_disk(
        str(tmp_path / "ds")
    )
    got = corpus.load(str(tmp_path / "ds"), 100, text_field="body")
    assert bytes(torch.cat([got.train, got.val]).tolist()) == "\n".join(texts).encode()


def test_a_checkpoint_model_folder_names_its_run(tmp_path):
    from megalith.train import finetune

    folder = tmp_path / "runs" / "mine" / "checkpoints" / "step_000040" / "model"
    folder.mkdir(parents=True)
    assert finetune.label(str(folder)) == "mine"
    assert finetune.label(str(tmp_path / "ckpt-llama")) == "ckpt-llama"
