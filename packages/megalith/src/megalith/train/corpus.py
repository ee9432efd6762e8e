"""Text for `megalith train`: the built-in corpus or the user's files, as bytes.

Tokens are bytes (vocabulary 256): any text trains with no tokenizer to fetch.
The last 5% of the text is held out for validation. The unigram baseline (the
entropy of the training bytes, in nats) is what a model that ignores context
scores; a model that learned anything scores well under it.
Bytes that are not text (an archive, an image, a model file passed as --data) train too,
but on noise: each such file gets a warning naming it.
With --tokenizer the text is a Hugging Face tokenizer's tokens instead (tokenize.py);
.jsonl files and `datasets` folders give their records' texts (data_formats.py).
"""

from __future__ import annotations

import gzip
import math
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from . import data_formats

BUILTIN = Path(__file__).resolve().parents[1] / "data" / "shakespeare.txt.gz"
VOCAB = 256
TEXT_SUFFIXES = (".txt", ".md", ".rst", ".py", ".text")
SNIFF_BYTES = 1 << 16  # how much of each file is looked at to tell text from binary
#: more than this share of a sample that is NUL, other control bytes or invalid UTF-8: binary
BINARY_SHARE = 0.05
_CONTROL = bytes(b for b in range(32) if b not in b"\t\n\r\f\v\b\x1b")


def binary_share(data: bytes) -> float:
    """The share of the first SNIFF_BYTES of data that cannot be text."""
    sample = data[:SNIFF_BYTES]
    if not sample:
        return 0.0
    bad = sum(sample.count(bytes([b])) for b in _CONTROL)
    text = sample.decode("utf-8", errors="replace")
    # the cut at SNIFF_BYTES may split one character: not a sign of binary data
    bad += max(0, text.count("\ufffd") - (1 if len(data) > SNIFF_BYTES else 0))
    return bad / len(sample)


def _warn_if_binary(path: Path, data: bytes) -> None:
    share = binary_share(data)
    if share > BINARY_SHARE:
        warnings.warn(
            f"--data {path}: {100 * share:.0f}% of its first {min(len(data), SNIFF_BYTES)} bytes "
            "are not text (NUL or control bytes, or invalid UTF-8): it looks like a binary "
            "file, and megalith train would learn its bytes as if they were text. Pass text "
            f"files ({', '.join(TEXT_SUFFIXES)}, or .gz of one) or a folder of them.",
            stacklevel=3,
        )


@dataclass(frozen=True)
class Corpus:
    name: str
    train: torch.Tensor  # uint8 bytes, or int32 token ids
    val: torch.Tensor
    vocab: int = VOCAB
    unit: str = "byte"  # what one token is, for the summary's bits per unit

    @property
    def unigram_nats(self) -> float:
        counts = torch.bincount(self.train.long(), minlength=self.vocab).double()
        p = counts[counts > 0] / counts.sum()
        return float(-(p * p.log()).sum())


def _read_file(path: Path, text_field: str) -> bytes:
    if path.suffix == ".jsonl":
        return data_formats.jsonl_text(path, text_field)
    data = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    _warn_if_binary(path, data)
    return data


def _read(path: Path, text_field: str = "text") -> bytes:
    if data_formats.is_dataset_dir(path):
        return data_formats.dataset_text(path, text_field)
    if path.is_dir():
        suffixes = (*TEXT_SUFFIXES, ".jsonl")
        files = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix in suffixes)
        if not files:
            raise FileNotFoundError(
                f"--data {path}: no text files ({', '.join(suffixes)}) under it"
            )
        return b"\n".join(_read_file(f, text_field) for f in files)
    return _read_file(path, text_field)


def check(data: str | None, text_field: str = "text") -> None:
    """ValueError naming what --data lacks, from a look at it (before any rank reads it)."""
    if data is None:
        return
    path = Path(data)
    if not path.exists():
        raise ValueError(f"--data {path}: no such file or directory")
    if data_formats.is_dataset_dir(path):
        data_formats.dataset_text(path, text_field, first_only=True)
    elif path.suffix == ".jsonl":
        data_formats.jsonl_text(path, text_field, first_only=True)


def load(
    data: str | None, min_bytes: int, tokenizer: Any = None, text_field: str = "text"
) -> Corpus:
    """The corpus as bytes, or with a tokenizer (megalith.train.tokenize) as its token ids;
    min_bytes: the fewest tokens that train and validate."""
    path = Path(data) if data else BUILTIN
    if not path.exists():
        raise FileNotFoundError(f"--data {path}: no such file or directory")
    raw = _read(path, text_field)
    name = "built-in Shakespeare" if data is None else str(path)
    if tokenizer is None or tokenizer.name == "bytes":
        t, vocab, unit = torch.frombuffer(bytearray(raw), dtype=torch.uint8), VOCAB, "byte"
    else:
        ids = tokenizer.encode(raw.decode("utf-8", errors="replace"))
        t, vocab, unit = torch.tensor(ids, dtype=torch.int32), tokenizer.vocab_size, "token"
    if len(t) < min_bytes:
        raise ValueError(
            f"--data {path}: {len(t)} {unit}s of text; need at least {min_bytes} "
            "(20 sequences of --seq-len + 1) to train and validate"
        )
    cut = max(len(t) - max(len(t) // 20, min_bytes // 2), min_bytes // 2)
    return Corpus(name, t[:cut].clone(), t[cut:].clone(), vocab, unit)


def batch(
    tokens: torch.Tensor, batch_size: int, seq_len: int, generator: torch.Generator
) -> torch.Tensor:
    """batch_size random windows of seq_len + 1 bytes, as int64."""
    starts = torch.randint(0, len(tokens) - seq_len - 1, (batch_size,), generator=generator)
    idx = starts[:, None] + torch.arange(seq_len + 1)
    return tokens[idx].long()


def batch_generator(seed: int, step: int, rank: int, split: str) -> torch.Generator:
    """The data position is the step: batch (step, rank) is the same on a resumed run."""
    salt = 0 if split == "train" else 1
    return torch.Generator().manual_seed(((seed * 1_000_003 + step) * 4099 + rank) * 2 + salt)


def bits(nats: float) -> float:
    return nats / math.log(2)
