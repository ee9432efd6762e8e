"""Tokens for `megalith train` and `megalith sample`: bytes by default (vocabulary 256,
nothing to fetch), or a local Hugging Face tokenizer (--tokenizer DIR: a folder that
transformers' save_pretrained wrote, or one holding a `tokenizers` tokenizer.json)."""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

BYTE_VOCAB = 256


class Tokenizer(Protocol):
    name: str
    vocab_size: int

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: list[int]) -> str: ...


class ByteTokenizer:
    """UTF-8 bytes as tokens."""

    name = "bytes"
    vocab_size = BYTE_VOCAB

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: list[int]) -> str:
        return bytes(i for i in ids if 0 <= i < BYTE_VOCAB).decode("utf-8", errors="replace")


class HFTokenizer:
    """A local tokenizer through transformers (any of its formats), or `tokenizers` alone
    for a folder with tokenizer.json where transformers is not installed."""

    def __init__(self, directory: str) -> None:
        self.name = directory
        try:
            from transformers import AutoTokenizer
        except ImportError:
            self._fast = _tokenizers_only(directory)
            self.vocab_size = self._fast.get_vocab_size(with_added_tokens=True)
            self._hf = None
            return
        try:
            self._hf = AutoTokenizer.from_pretrained(directory, local_files_only=True)
        except (OSError, ValueError) as e:
            raise ValueError(
                f"--tokenizer {directory}: transformers cannot read a tokenizer there ({e}); "
                "pass the folder tokenizer.save_pretrained wrote"
            ) from None
        self.vocab_size = len(self._hf)

    def encode(self, text: str) -> list[int]:
        if self._hf is None:
            return self._fast.encode(text, add_special_tokens=False).ids
        return self._hf.encode(text, add_special_tokens=False)

    def decode(self, ids: list[int]) -> str:
        if self._hf is None:
            return self._fast.decode(ids)
        return self._hf.decode(ids)


def _tokenizers_only(directory: str):  # -> tokenizers.Tokenizer
    file = Path(directory) / "tokenizer.json"
    if not file.is_file():
        raise ValueError(
            f"--tokenizer {directory}: no tokenizer.json, and reading other formats needs "
            "transformers: pip install transformers"
        )
    try:
        from tokenizers import Tokenizer as FastTokenizer
    except ImportError:
        raise ValueError(
            "--tokenizer needs the tokenizers library: pip install tokenizers"
        ) from None
    return FastTokenizer.from_file(str(file))


def load(directory: str | None) -> Tokenizer:
    """--tokenizer DIR, or bytes without one; ValueError naming what is wrong."""
    if directory is None:
        return ByteTokenizer()
    if not Path(directory).is_dir():
        raise ValueError(f"--tokenizer {directory}: no such directory")
    return HFTokenizer(directory)


def has_tokenizer(directory: str | Path) -> bool:
    """Whether a model folder also holds a tokenizer (for a hint to pass --tokenizer)."""
    d = Path(directory)
    return any((d / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json", "vocab.json"))
