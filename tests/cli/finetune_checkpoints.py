"""Tiny pretrained checkpoints for the fine-tuning tests of `megalith train` and
`megalith sample`: a byte-level BPE tokenizer trained here on the built-in corpus, and a
Llama or GPT-2 of random weights written by transformers' own save_pretrained (with the
tokenizer beside it, as a Hub download has it)."""

from __future__ import annotations

import gzip
from pathlib import Path

from megalith.train.corpus import BUILTIN

VOCAB = 320
CONTEXT = 32


def text(n_bytes: int = 200_000) -> str:
    return gzip.decompress(BUILTIN.read_bytes())[:n_bytes].decode("utf-8", errors="replace")


def write_tokenizer(directory: Path) -> None:
    """A byte-level BPE of VOCAB tokens (every text encodes), as transformers saves it."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=["<|endoftext|>"],
    )
    tok.train_from_iterator(text().splitlines(), trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>")
    fast.save_pretrained(str(directory))


def write_model(directory: Path, family: str = "llama", seed: int = 0) -> Path:
    """A tiny model of random weights (no dropout), saved with its tokenizer."""
    import torch
    import transformers

    torch.manual_seed(seed)
    if family == "llama":
        config = transformers.LlamaConfig(
            vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
            num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=CONTEXT,
            bos_token_id=0, eos_token_id=0,
        )  # fmt: skip
    else:
        config = transformers.GPT2Config(
            vocab_size=VOCAB, n_positions=CONTEXT, n_embd=32, n_layer=2, n_head=2,
            resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0,
        )  # fmt: skip
    model = transformers.AutoModelForCausalLM.from_config(config)
    model.save_pretrained(str(directory))
    write_tokenizer(directory)
    return directory


_WRITTEN: dict[str, Path] = {}


def cached_model(family: str = "llama") -> Path:
    """One tiny checkpoint per family for the whole test process (writing it costs
    seconds of imports)."""
    import atexit
    import shutil
    import tempfile

    if family not in _WRITTEN:
        folder = tempfile.mkdtemp(prefix=f"tiny-{family}-")
        atexit.register(shutil.rmtree, folder, True)
        _WRITTEN[family] = write_model(Path(folder) / family)
    return _WRITTEN[family]


def write_jsonl(path: Path, records: int = 60, field: str = "text") -> Path:
    """Records of a few hundred characters of the built-in corpus each."""
    import json

    body = text(records * 400)
    lines = [json.dumps({field: body[i * 400 : (i + 1) * 400], "id": i}) for i in range(records)]
    path.write_text("\n".join(lines) + "\n")
    return path


def rank_argv(argv: list[str], monkeypatch) -> list[str]:
    """`megalith train ARGV` up to where it would start the ranks: its checks run here
    and the options the ranks would get come back (the launcher's part left out)."""
    from megalith.cli import main as cli_main

    started: list[list[str]] = []

    def launch(words: list[str]) -> int:
        started.append(words[words.index("megalith.train") + 1 :])
        return 0

    args = cli_main.build_parser().parse_args(["train", *argv])
    monkeypatch.setattr(cli_main, "main", launch)
    assert args.func(args) == 0
    return started[0]


def train_ranks(rank: int, argv: list[str]) -> str:
    """What each rank runs, `python -m megalith.train ARGV`; returns what it printed."""
    import contextlib
    import io

    from megalith.train.__main__ import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(argv) == 0
    return out.getvalue()
