"""runs/NAME/curves.png: the plot's data (train and validation loss, tokens/s smoothed),
the dependency-free renderer's titles, labels, ticks and legend (and its pixels), and
matplotlib's figure where matplotlib is installed."""

from __future__ import annotations

import random
import struct
import zlib

import pytest

from megalith.train import plot, plot_png


def _rows(n: int = 60, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    rows = []
    for step in range(1, n + 1):
        row = {
            "step": step,
            "loss": 5.5 / (1 + step / 20) + 1.2 + rng.random() * 0.1,
            "tokens_per_s": 9000.0 + rng.random() * 2000.0,
        }
        if step % 15 == 0:
            row["val_loss"] = row["loss"] + rng.random() * 0.2
        rows.append(row)
    return rows


def _decode(png: bytes) -> tuple[int, int, bytes]:
    """Width, height and the RGB rows (filter bytes dropped) of an 8-bit RGB PNG."""
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    at, data, size = 8, b"", None
    while at < len(png):
        (length,) = struct.unpack(">I", png[at : at + 4])
        kind, body = png[at + 4 : at + 8], png[at + 8 : at + 8 + length]
        crc = struct.unpack(">I", png[at + 8 + length : at + 12 + length])[0]
        assert zlib.crc32(kind + body) & 0xFFFFFFFF == crc, kind
        if kind == b"IHDR":
            size = struct.unpack(">II", body[:8])
        elif kind == b"IDAT":
            data += body
        at += 12 + length
    w, h = size
    raw = zlib.decompress(data)
    assert len(raw) == h * (1 + 3 * w)
    return w, h, b"".join(raw[y * (1 + 3 * w) + 1 : (y + 1) * (1 + 3 * w)] for y in range(h))


def _count(pixels: bytes, color: tuple[int, int, int]) -> int:
    want = bytes(color)
    return sum(pixels[i : i + 3] == want for i in range(0, len(pixels), 3))


def test_curves_and_smoothing():
    rows = _rows()
    c = plot.curves(rows)
    assert c.steps == list(range(1, 61)) and c.val_steps == [15, 30, 45, 60]
    assert c.val_loss == [r["val_loss"] for r in rows if "val_loss" in r]
    assert c.window == 6
    tok = [r["tokens_per_s"] for r in rows]
    assert c.tokens_per_s_smoothed[0] == tok[0]
    assert c.tokens_per_s_smoothed[2] == pytest.approx(sum(tok[:3]) / 3)
    assert c.tokens_per_s_smoothed[40] == pytest.approx(sum(tok[35:41]) / 6)
    assert plot_png.nice_ticks(1.8, 7.1) == [2.0, 4.0, 6.0]
    assert plot_png.nice_ticks(0.5, 60.5, 8) == [10.0, 20.0, 30.0, 40.0, 50.0, 60.0]


def test_builtin_plot_has_titles_labels_ticks_and_legend(tmp_path):
    rows = _rows()
    c = plot.curves(rows)
    canvas = plot.builtin_canvas(c, "megalith train: run-a")
    texts = canvas.texts
    for words in (
        "megalith train: run-a",
        "loss (nats/token)",
        "throughput (tokens/s)",
        "train",
        "validation",
        "each step",
        "smoothed (6 steps)",
    ):
        assert words in texts, (words, texts)
    assert texts.count("step") == 2  # each panel's x-axis label
    assert {"10", "20", "30", "40", "50", "60"} <= set(texts)  # step ticks
    assert {"3", "4", "5", "6", "9000", "10K", "11K"} <= set(texts), texts  # y ticks
    assert all(ch.upper() in plot_png.GLYPHS for t in texts for ch in t), texts
    assert plot.write_plot(tmp_path / "c.png", rows, "run-a", builtin=True) == "builtin"
    w, h, pixels = _decode((tmp_path / "c.png").read_bytes())
    assert (w, h) == (plot_png.W, plot_png.TITLE_H + 2 * plot_png.PANEL_H)
    for color in (plot.TRAIN, plot.VAL, plot.RAW, plot.SMOOTH, plot_png.BLACK):
        assert _count(pixels, color) > 20, color


def test_matplotlib_plot(tmp_path):
    pytest.importorskip("matplotlib")
    c = plot.curves(_rows())
    fig = plot.matplotlib_figure(c, "megalith train: run-a")
    loss, speed = fig.axes
    assert fig._suptitle.get_text() == "megalith train: run-a"
    assert (loss.get_title(), speed.get_title()) == ("loss", "throughput")
    assert (loss.get_ylabel(), speed.get_ylabel()) == ("loss (nats/token)", "tokens/s")
    assert loss.get_xlabel() == speed.get_xlabel() == "step"
    assert [t.get_text() for t in loss.get_legend().get_texts()] == ["train", "validation"]
    legend = [t.get_text() for t in speed.get_legend().get_texts()]
    assert legend == ["each step", "smoothed (6 steps)"]
    assert list(loss.lines[1].get_xdata()) == [15, 30, 45, 60]
    assert all(float(t).is_integer() for t in speed.get_xticks())
    assert plot.write_plot(tmp_path / "c.png", _rows(), "run-a") == "matplotlib"
    png = (tmp_path / "c.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and png[12:16] == b"IHDR"
    assert struct.unpack(">II", png[16:24]) == (800, 600)


def test_without_matplotlib_the_builtin_draws(tmp_path, monkeypatch):
    monkeypatch.setattr(plot, "have_matplotlib", lambda: False)
    assert plot.write_plot(tmp_path / "c.png", _rows(8), "run-b") == "builtin"
    assert (tmp_path / "c.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
