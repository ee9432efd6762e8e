"""README.md's "Fine-tune a Hugging Face model" runs as written: its commands, with the
tiny checkpoint's paths and sizes substituted (a tiny Llama transformers wrote, with its
tokenizer), train a LoRA adapter on 2 CPU ranks and sample from it; its Python block
loads the adapter with peft, and that model's greedy text is what `megalith sample` printed."""

from __future__ import annotations

import re
import shlex

import pytest
import torch

from megalith.testing import run_grid
from tests.cli import finetune_checkpoints as fc
from tests.support.readme import ROOT

pytest.importorskip("transformers")
pytest.importorskip("peft")

#: the README's sizes, made tiny (a context of fc.CONTEXT, a few steps)
SIZES = {"--seq-len": str(fc.CONTEXT), "--steps": "3", "--max-new-tokens": "6"}


def _blocks() -> tuple[list[list[str]], str]:
    text = (ROOT / "README.md").read_text()
    section = text.split("## Fine-tune a Hugging Face model", 1)[1].split("\n## ", 1)[0]
    commands = re.search(r"<!-- finetune-commands.*?-->\n```\n(.*?)```", section, re.S)
    python = re.search(r"<!-- finetune-python.*?-->\n```python\n(.*?)```", section, re.S)
    assert commands and python, "the README section lost its marked blocks"
    return [shlex.split(line) for line in commands.group(1).splitlines() if line], python.group(1)


def _substitute(words: list[str], paths: dict[str, str]) -> list[str]:
    out = []
    for i, w in enumerate(words):
        if i and words[i - 1] in SIZES:
            w = SIZES[words[i - 1]]
        for old, new in paths.items():
            w = w.replace(old, new)
        out.append(w)
    return out


@pytest.mark.timeout(300)
def test_the_readme_fine_tunes_and_samples(tmp_path, monkeypatch, capsys):
    from megalith.cli.main import main
    from megalith.train.generate import generate

    (train, sample), python = _blocks()
    assert train[:2] == ["megalith", "train"] and sample[:2] == ["megalith", "sample"]
    ckpt = fc.cached_model("llama")
    paths = {
        "ckpt/tinyllama": str(ckpt),
        "notes.jsonl": str(fc.write_jsonl(tmp_path / "notes.jsonl")),
        "runs/my-lora": str(tmp_path / "runs" / "my-lora"),
    }
    words = [*_substitute(train[2:], paths), "--out", str(tmp_path / "runs")]
    run_grid(fc.train_ranks, [fc.rank_argv(words, monkeypatch)], 2, timeout=240)
    adapter = tmp_path / "runs" / "my-lora" / "adapter"
    assert (adapter / "adapter_config.json").is_file()
    assert (adapter / "adapter_model.safetensors").is_file()

    capsys.readouterr()
    assert main(["sample", *_substitute(sample[2:], paths)]) == 0
    printed = capsys.readouterr().out.rstrip("\n")

    scope: dict = {}
    code = python
    for old, new in paths.items():
        code = code.replace(old, new)
    exec(compile(code, "README.md", "exec"), scope)  # the README's own lines
    model = scope["model"].eval()
    import transformers

    prompt = sample[sample.index("--prompt") + 1]
    tok = transformers.AutoTokenizer.from_pretrained(str(ckpt))
    with torch.no_grad():
        new = generate(model, tok.encode(prompt), 6, context=fc.CONTEXT)
    assert printed == prompt + tok.decode(new)
