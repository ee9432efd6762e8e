"""A PNG of two curves (loss, throughput) with no plotting library: a few hundred
pixels drawn into a byte array and encoded with zlib."""

from __future__ import annotations

import struct
import zlib
from collections.abc import Sequence
from pathlib import Path

W, H, PAD = 640, 200, 24
COLORS = [(31, 119, 180), (214, 39, 40)]
FONT = {  # 3x5 digits and a few letters for the axis labels
    "0": "111101101101111",
    "1": "010110010010111",
    "2": "111001111100111",
    "3": "111001111001111",
    "4": "101101111001001",
    "5": "111100111001111",
    "6": "111100111101111",
    "7": "111001010010010",
    "8": "111101111101111",
    "9": "111101111001111",
    ".": "000000000000010",
    "k": "100101110101101",
    "-": "000000111000000",
}


def _panel(img: bytearray, top: int, ys: Sequence[float], color: tuple[int, int, int]) -> None:
    if not ys:
        return
    lo, hi = min(ys), max(ys)
    span = (hi - lo) or 1.0
    n = len(ys)

    def px(i: int, y: float) -> tuple[int, int]:
        x = PAD + int(i * (W - 2 * PAD) / max(n - 1, 1))
        return x, top + PAD + int((hi - y) / span * (H - 2 * PAD))

    for x in range(PAD, W - PAD):  # axes
        _set(img, x, top + H - PAD, (0, 0, 0))
    for y in range(top + PAD, top + H - PAD):
        _set(img, PAD, y, (0, 0, 0))
    prev = px(0, ys[0])
    for i in range(1, n):
        cur = px(i, ys[i])
        _line(img, prev, cur, color)
        prev = cur
    _text(img, PAD + 4, top + 4, _short(hi), (0, 0, 0))
    _text(img, PAD + 4, top + H - PAD - 8, _short(lo), (0, 0, 0))
    for dx in range(8):  # a colour key in the corner (the loss panel on top, tokens/s below)
        for dy in range(8):
            _set(img, W - PAD - 10 + dx, top + 4 + dy, color)


def _short(v: float) -> str:
    return f"{v / 1000:.1f}k" if abs(v) >= 1000 else f"{v:.3f}"


def _set(img: bytearray, x: int, y: int, c: tuple[int, int, int]) -> None:
    if 0 <= x < W and 0 <= y < 2 * H:
        o = (y * W + x) * 3
        img[o : o + 3] = bytes(c)


def _line(img: bytearray, a: tuple[int, int], b: tuple[int, int], c: tuple[int, int, int]) -> None:
    steps = max(abs(b[0] - a[0]), abs(b[1] - a[1]), 1)
    for s in range(steps + 1):
        _set(img, a[0] + (b[0] - a[0]) * s // steps, a[1] + (b[1] - a[1]) * s // steps, c)


def _text(img: bytearray, x: int, y: int, text: str, c: tuple[int, int, int]) -> None:
    for ch in text:
        glyph = FONT.get(ch)
        if glyph:
            for k, bit in enumerate(glyph):
                if bit == "1":
                    _set(img, x + k % 3, y + k // 3, c)
        x += 4


def write_png(path: Path, loss: Sequence[float], tokens_per_s: Sequence[float]) -> None:
    img = bytearray(b"\xff" * (W * 2 * H * 3))
    _panel(img, 0, loss, COLORS[0])
    _panel(img, H, tokens_per_s, COLORS[1])
    raw = b"".join(b"\x00" + bytes(img[y * W * 3 : (y + 1) * W * 3]) for y in range(2 * H))

    def chunk(kind: bytes, data: bytes) -> bytes:
        return (
            struct.pack(">I", len(data))
            + kind
            + data
            + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)
        )

    png = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", W, 2 * H, 8, 2, 0, 0, 0))
    png += chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b"")
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(png)
    tmp.replace(path)
