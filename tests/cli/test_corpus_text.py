"""megalith train's corpus: binary data given as training text is warned about, naming the
file; text (the built-in corpus, UTF-8 in any script, a folder of files) is not."""

from __future__ import annotations

import gzip
import warnings

import pytest
import torch

from megalith.train import corpus

MIN = 20 * 65


def _random_bytes(n: int, seed: int) -> bytes:
    g = torch.Generator().manual_seed(seed)
    return bytes(torch.randint(0, 256, (n,), generator=g, dtype=torch.uint8).tolist())


def _silent(data: str | None) -> corpus.Corpus:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        return corpus.load(data, MIN)


@pytest.mark.parametrize("seed", [0, 1])
def test_binary_file_is_warned_about_by_name(tmp_path, seed):
    path = tmp_path / "weights.bin"
    path.write_bytes(_random_bytes(5000, seed))
    with pytest.warns(
        UserWarning, match=r"weights\.bin: \d+% of its first 5000 bytes are not text"
    ):
        got = corpus.load(str(path), MIN)
    assert len(got.train) + len(got.val) == 5000, "it still trains, as asked"


def test_gzip_of_binary_and_a_binary_file_in_a_folder(tmp_path):
    packed = tmp_path / "blob.gz"
    packed.write_bytes(gzip.compress(_random_bytes(4000, 2)))
    with pytest.warns(UserWarning, match=r"blob\.gz: .* looks like a binary file"):
        corpus.load(str(packed), MIN)
    folder = tmp_path / "texts"
    folder.mkdir()
    (folder / "a.txt").write_text("to be or not to be, that is the question\n" * 60)
    (folder / "b.txt").write_bytes(_random_bytes(3000, 3))
    with pytest.warns(UserWarning) as caught:
        corpus.load(str(folder), MIN)
    named = [str(w.message) for w in caught]
    assert len(named) == 1 and "b.txt" in named[0] and "a.txt" not in named[0], named


def test_text_is_not_warned_about(tmp_path):
    assert len(_silent(None).train) > 100_000  # the built-in Shakespeare
    g = torch.Generator().manual_seed(4)
    words = ["Grüße", "naïve", "日本語の文", "λόγος", "tab\there", "line\r\n", "plain"]
    picks = torch.randint(0, len(words), (800,), generator=g).tolist()
    path = tmp_path / "mixed.txt"
    path.write_text(" ".join(words[i] for i in picks), encoding="utf-8")
    _silent(str(path))
    assert corpus.binary_share(path.read_bytes()) == 0.0
    assert corpus.binary_share(_random_bytes(1000, 5)) > 0.3
