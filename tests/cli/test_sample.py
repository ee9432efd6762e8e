"""`megalith sample`: the text it prints equals a plain PyTorch greedy loop over the
same model, for a transformers folder, a from-scratch run's checkpoint (bytes), and a
LoRA run (base + adapter, or a checkpoint of it); top-k draws only from the top k; bad
options fail in one line."""

from __future__ import annotations

import json

import pytest
import torch

from tests.cli import finetune_checkpoints as fc

transformers = pytest.importorskip("transformers")


SMALL = {
    "vocab_size": 256,
    "d_model": 32,
    "n_layers": 2,
    "n_heads": 2,
    "d_ff": 64,
    "max_seq_len": 64,
}


def _sample(capsys, *argv: str) -> str:
    from megalith.cli.main import main

    assert main(["sample", *argv]) == 0
    return capsys.readouterr().out.rstrip("\n")


@torch.no_grad()
def _greedy(model, ids: list[int], n: int) -> list[int]:
    ids = list(ids)
    for _ in range(n):
        out = model(torch.tensor([ids]))
        logits = out if isinstance(out, torch.Tensor) else out.logits
        ids.append(int(logits[0, -1].argmax()))
    return ids


def _tokenizer(path):
    return transformers.AutoTokenizer.from_pretrained(str(path))


def test_a_transformers_folder_greedy_and_top_k(capsys):
    ckpt = fc.cached_model("gpt2")
    tok = _tokenizer(ckpt)
    prompt = "ROMEO: what"
    ids = tok.encode(prompt)
    model = transformers.AutoModelForCausalLM.from_pretrained(str(ckpt)).eval()
    want = prompt + tok.decode(_greedy(model, ids, 6)[len(ids) :])
    assert _sample(capsys, str(ckpt), "--prompt", prompt, "--max-new-tokens", "6") == want
    cold = _sample(capsys, str(ckpt), "--prompt", prompt, "--max-new-tokens", "6", "--top-k", "9",
                   "--temperature", "0")  # fmt: skip
    assert cold == want
    from megalith.train.generate import generate

    drawn = generate(model, ids, 12, context=fc.CONTEXT, top_k=3, temperature=2.0, seed=5)
    again = generate(model, ids, 12, context=fc.CONTEXT, top_k=3, temperature=2.0, seed=5)
    assert drawn == again
    seq = list(ids)
    for token in drawn:  # each drawn token is among the 3 likeliest after what came before
        with torch.no_grad():
            top = model(torch.tensor([seq])).logits[0, -1].topk(3).indices.tolist()
        assert token in top
        seq.append(token)


def test_a_run_checkpoint_in_bytes(tmp_path, capsys):
    """A from-scratch run (bytes, megalith's GPT): its latest checkpoint, or a given one."""
    from megalith import models
    from megalith.models.hf import save_pretrained

    run = tmp_path / "runs" / "scratch"
    for step, seed in ((1, 3), (2, 4)):
        ckpt = run / "checkpoints" / f"step_{step:06d}"
        model = models.create("gpt-tiny", device="cpu", seed=seed, **SMALL)
        save_pretrained(model, ckpt / "model")
        (ckpt / "trainer.json").write_text(json.dumps({"step": step, "args": {"lora": None}}))
    (run / "checkpoints" / "latest").write_text("step_000002")
    prompt = "To be"
    ids = list(prompt.encode())
    for source, seed in ((run, 4), (run / "checkpoints" / "step_000001", 3)):
        model = models.create("gpt-tiny", device="cpu", seed=seed, **SMALL).eval()
        new = _greedy(model, ids, 8)[len(ids) :]
        want = prompt + bytes(new).decode("utf-8", errors="replace")
        assert _sample(capsys, str(source), "--prompt", prompt, "--max-new-tokens", "8") == want


def test_a_lora_run_base_plus_adapter(tmp_path, capsys):
    """runs/NAME/adapter/ on the base the run names, and a checkpoint of the run (the
    peft-wrapped model's files), against peft's own model."""
    peft = pytest.importorskip("peft")
    from safetensors.torch import save_file

    ckpt = fc.cached_model("llama")
    torch.manual_seed(1)
    base = transformers.AutoModelForCausalLM.from_pretrained(str(ckpt))
    config = peft.LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, task_type="CAUSAL_LM")
    model = peft.get_peft_model(base, config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)  # an adapter that changes the text
    run = tmp_path / "runs" / "lora"
    model.save_pretrained(str(run / "adapter"))
    step = run / "checkpoints" / "step_000005"
    (step / "model").mkdir(parents=True)
    state = {k: v.contiguous() for k, v in model.get_base_model().state_dict().items()}
    save_file(state, str(step / "model" / "model.safetensors"))
    args = {"lora": 4, "lora_alpha": None, "lora_targets": None, "from_pretrained": str(ckpt),
            "tokenizer": str(ckpt)}  # fmt: skip
    (step / "trainer.json").write_text(json.dumps({"step": 5, "args": args}))
    config_file = run / "adapter" / "adapter_config.json"
    adapter_config = json.loads(config_file.read_text())
    config_file.write_text(json.dumps({**adapter_config, "base_model_name_or_path": str(ckpt)}))

    tok = _tokenizer(ckpt)
    prompt = "JULIET: my"
    ids = tok.encode(prompt)
    want_ids = _greedy(model.eval(), ids, 6)[len(ids) :]
    plain = transformers.AutoModelForCausalLM.from_pretrained(str(ckpt)).eval()
    assert want_ids != _greedy(plain, ids, 6)[len(ids) :], "the adapter changes nothing"
    want = prompt + tok.decode(want_ids)
    for source in (run, step, run / "adapter"):
        got = _sample(capsys, str(source), "--prompt", prompt, "--max-new-tokens", "6")
        assert got == want, source


def test_bad_options_fail_in_one_line(tmp_path):
    from megalith.cli.main import main

    ckpt = fc.cached_model("gpt2")
    cases = [
        ([str(tmp_path / "nowhere"), "--prompt", "x"], "no such run"),
        ([str(ckpt), "--prompt", "x", "--top-k", "-1"], "--top-k -1"),
        ([str(ckpt), "--prompt", "x", "--max-new-tokens", "0"], "--max-new-tokens 0"),
        ([str(tmp_path), "--prompt", "x"], "no complete checkpoint"),
    ]
    for argv, words in cases:
        with pytest.raises(SystemExit) as e:
            main(["sample", *argv])
        message = str(e.value.code)
        assert words in message and "\n" not in message, message
