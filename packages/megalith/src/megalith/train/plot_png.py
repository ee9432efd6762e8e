"""The run's plot with no plotting library: two panels (loss; tokens/s) drawn into an
RGB byte array with a 3x5 pixel font at twice its size, then encoded as a PNG with
zlib. Each panel has its title, y ticks with values, step ticks along x, an x-axis
label and a legend, as the matplotlib plot has."""

from __future__ import annotations

import itertools
import math
import struct
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field

W, PANEL_H, TITLE_H = 720, 250, 30
LEFT, RIGHT, TOP, BOTTOM = 72, 16, 30, 44  # a panel's margins around its plot area
SCALE = 2  # font pixels per glyph pixel
ADVANCE = 4 * SCALE
BLACK, GREY, WHITE = (0, 0, 0), (215, 215, 215), (255, 255, 255)

# 3 columns x 5 rows per glyph, rows top to bottom; lower case is drawn as upper case
_FONT = """
A .#. #.# ### #.# #.#   B ##. #.# ##. #.# ##.   C .## #.. #.. #.. .##   D ##. #.# #.# #.# ##.
E ### #.. ##. #.. ###   F ### #.. ##. #.. #..   G .## #.. #.# #.# .##   H #.# #.# ### #.# #.#
I ### .#. .#. .#. ###   J ..# ..# ..# #.# .#.   K #.# #.# ##. #.# #.#   L #.. #.. #.. #.. ###
M #.# ### ### #.# #.#   N ##. #.# #.# #.# #.#   O .#. #.# #.# #.# .#.   P ##. #.# ##. #.. #..
Q .#. #.# #.# ##. .##   R ##. #.# ##. #.# #.#   S .## #.. .#. ..# ##.   T ### .#. .#. .#. .#.
U #.# #.# #.# #.# ###   V #.# #.# #.# #.# .#.   W #.# #.# ### ### #.#   X #.# #.# .#. #.# #.#
Y #.# #.# .#. .#. .#.   Z ### ..# .#. #.. ###   0 ### #.# #.# #.# ###   1 .#. ##. .#. .#. ###
2 ### ..# ### #.. ###   3 ### ..# ### ..# ###   4 #.# #.# ### ..# ..#   5 ### #.. ### ..# ###
6 ### #.. ### #.# ###   7 ### ..# .#. .#. .#.   8 ### #.# ### #.# ###   9 ### #.# ### ..# ###
. ... ... ... ... .#.   , ... ... ... .#. #..   - ... ... ### ... ...   / ..# ..# .#. #.. #..
: ... .#. ... .#. ...   ( .#. #.. #.. #.. .#.   ) .#. ..# ..# ..# .#.   % #.# ..# .#. #.. #.#
+ ... .#. ### .#. ...   _ ... ... ... ... ###   = ... ### ... ### ...
"""
_WORDS = _FONT.split()  # a character, then its five rows
GLYPHS = {_WORDS[i]: "".join(_WORDS[i + 1 : i + 6]) for i in range(0, len(_WORDS), 6)}
GLYPHS[" "] = "." * 15


@dataclass
class Series:
    label: str
    xs: Sequence[float]
    ys: Sequence[float]
    color: tuple[int, int, int]
    markers: bool = False


@dataclass
class Canvas:
    width: int
    height: int
    pixels: bytearray = field(init=False)
    texts: list[str] = field(default_factory=list)  # what was written, for tests

    def __post_init__(self) -> None:
        self.pixels = bytearray(b"\xff" * (self.width * self.height * 3))

    def set(self, x: int, y: int, c: tuple[int, int, int]) -> None:
        if 0 <= x < self.width and 0 <= y < self.height:
            o = (y * self.width + x) * 3
            self.pixels[o : o + 3] = bytes(c)

    def line(self, a: tuple[int, int], b: tuple[int, int], c: tuple[int, int, int]) -> None:
        n = max(abs(b[0] - a[0]), abs(b[1] - a[1]), 1)
        for s in range(n + 1):
            self.set(a[0] + (b[0] - a[0]) * s // n, a[1] + (b[1] - a[1]) * s // n, c)

    def box(self, x0: int, y0: int, x1: int, y1: int, c: tuple[int, int, int]) -> None:
        for y in range(y0, y1):
            for x in range(x0, x1):
                self.set(x, y, c)

    def text(self, x: int, y: int, words: str, c: tuple[int, int, int] = BLACK) -> None:
        self.texts.append(words)
        for ch in words.upper():
            glyph = GLYPHS.get(ch, GLYPHS[" "])
            for k, bit in enumerate(glyph):
                if bit == "#":
                    px, py = x + (k % 3) * SCALE, y + (k // 3) * SCALE
                    self.box(px, py, px + SCALE, py + SCALE, c)
            x += ADVANCE

    def png(self) -> bytes:
        row = self.width * 3
        raw = b"".join(
            b"\x00" + bytes(self.pixels[y * row : (y + 1) * row]) for y in range(self.height)
        )

        def chunk(kind: bytes, data: bytes) -> bytes:
            crc = zlib.crc32(kind + data) & 0xFFFFFFFF
            return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", crc)

        header = struct.pack(">IIBBBBB", self.width, self.height, 8, 2, 0, 0, 0)
        return (
            b"\x89PNG\r\n\x1a\n"
            + chunk(b"IHDR", header)
            + chunk(b"IDAT", zlib.compress(raw, 9))
            + chunk(b"IEND", b"")
        )


def nice_ticks(lo: float, hi: float, most: int = 5) -> list[float]:
    """Round values (1, 2 or 5 times a power of ten apart) from lo to hi, at most `most`."""
    if not hi > lo:
        return [lo]
    raw = (hi - lo) / max(most - 1, 1)
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 5, 10) if m * power >= raw)
    first = math.ceil(lo / step - 1e-9) * step
    return [first + i * step for i in range(int((hi - first) / step + 1e-9) + 1)]


def tick_label(v: float, step: float) -> str:
    if abs(v) >= 1e6:
        return f"{v / 1e6:.3g}M"
    if abs(v) >= 1e4:
        return f"{v / 1e3:.4g}K"
    decimals = max(0, -math.floor(math.log10(step))) if step > 0 else 0
    return f"{v:.{min(decimals, 4)}f}"


def _range(values: Sequence[float]) -> tuple[float, float]:
    lo, hi = min(values), max(values)
    if hi == lo:
        pad = abs(lo) * 0.05 or 1.0
        return lo - pad, hi + pad
    pad = (hi - lo) * 0.05
    return lo - pad, hi + pad


def panel(canvas: Canvas, top: int, title: str, ylabel: str, series: list[Series]) -> None:
    """One panel with its plot area between the margins, from y = top."""
    x0, x1 = LEFT, canvas.width - RIGHT
    y0, y1 = top + TOP, top + PANEL_H - BOTTOM
    canvas.text(x0, top + 8, f"{title} ({ylabel})")
    drawn = [s for s in series if s.xs]
    if not drawn:
        return
    xlo, xhi = min(min(s.xs) for s in drawn), max(max(s.xs) for s in drawn)
    if xhi == xlo:
        xlo, xhi = xlo - 1, xhi + 1
    ylo, yhi = _range([y for s in drawn for y in s.ys])

    def px(x: float, y: float) -> tuple[int, int]:
        return (
            x0 + round((x - xlo) / (xhi - xlo) * (x1 - x0)),
            y1 - round((y - ylo) / (yhi - ylo) * (y1 - y0)),
        )

    yticks = nice_ticks(ylo, yhi, 6)
    ystep = yticks[1] - yticks[0] if len(yticks) > 1 else 1.0
    for v in yticks:
        _, y = px(xlo, v)
        canvas.line((x0, y), (x1, y), GREY)
        canvas.line((x0 - 4, y), (x0, y), BLACK)
        label = tick_label(v, ystep)
        canvas.text(x0 - 8 - ADVANCE * len(label), y - 5, label)
    xticks = [v for v in nice_ticks(xlo, xhi, 8) if float(v).is_integer()] or [xlo]
    for v in xticks:
        x, _ = px(v, ylo)
        canvas.line((x, y1), (x, y1 + 4), BLACK)
        label = f"{v:.0f}"
        canvas.text(x - ADVANCE * len(label) // 2, y1 + 8, label)
    canvas.line((x0, y1), (x1, y1), BLACK)
    canvas.line((x0, y0), (x0, y1), BLACK)
    canvas.text((x0 + x1) // 2 - 2 * ADVANCE, y1 + 24, "step")
    for s in drawn:
        points = [px(x, y) for x, y in zip(s.xs, s.ys, strict=True)]
        for a, b in itertools.pairwise(points):
            canvas.line(a, b, s.color)
        if s.markers or len(points) == 1:
            for x, y in points:
                canvas.box(x - 2, y - 2, x + 3, y + 3, s.color)
    width = max(len(s.label) for s in drawn) * ADVANCE + 30
    lx, ly = x1 - width - 6, y0 + 6
    canvas.box(lx, ly, lx + width, ly + 16 * len(drawn) + 6, WHITE)
    for i, s in enumerate(drawn):  # the legend: a swatch and the series' name
        canvas.box(lx + 6, ly + 8 + 16 * i, lx + 20, ly + 12 + 16 * i, s.color)
        canvas.text(lx + 26, ly + 5 + 16 * i, s.label)


def render(title: str, panels: list[tuple[str, str, list[Series]]]) -> Canvas:
    """A canvas with a title line and one panel per (title, y label, series)."""
    canvas = Canvas(W, TITLE_H + PANEL_H * len(panels))
    canvas.text(LEFT, 8, title)
    for i, (name, ylabel, series) in enumerate(panels):
        panel(canvas, TITLE_H + i * PANEL_H, name, ylabel, series)
    return canvas
