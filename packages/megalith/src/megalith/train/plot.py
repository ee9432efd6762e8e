"""runs/NAME/curves.png: train and validation loss over the steps, and tokens/s (each
step's and smoothed) below, with titles, axis labels, step ticks and legends. Drawn
with matplotlib when it is installed, else by plot_png (no plotting library)."""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import plot_png

TRAIN, VAL = (31, 119, 180), (255, 127, 14)
RAW, SMOOTH = (240, 170, 170), (214, 39, 40)


@dataclass(frozen=True)
class Curves:
    steps: list[int]
    loss: list[float]
    val_steps: list[int]
    val_loss: list[float]
    tokens_per_s: list[float]
    tokens_per_s_smoothed: list[float]
    window: int  # steps the smoothing averages over


def smooth(values: Sequence[float], window: int) -> list[float]:
    """The trailing mean over `window` values (fewer at the start)."""
    out, total = [], 0.0
    for i, v in enumerate(values):
        total += v
        if i >= window:
            total -= values[i - window]
        out.append(total / min(i + 1, window))
    return out


def curves(rows: Sequence[dict[str, Any]]) -> Curves:
    """The plot's data from metrics.jsonl's rows."""
    steps = [int(r["step"]) for r in rows]
    tok = [float(r["tokens_per_s"]) for r in rows]
    window = max(1, min(50, len(rows) // 10))
    vals = [(int(r["step"]), float(r["val_loss"])) for r in rows if "val_loss" in r]
    return Curves(
        steps=steps,
        loss=[float(r["loss"]) for r in rows],
        val_steps=[s for s, _ in vals],
        val_loss=[v for _, v in vals],
        tokens_per_s=tok,
        tokens_per_s_smoothed=smooth(tok, window),
        window=window,
    )


def have_matplotlib() -> bool:
    return importlib.util.find_spec("matplotlib") is not None


def write_plot(
    path: Path, rows: Sequence[dict[str, Any]], title: str, builtin: bool | None = None
) -> str:
    """Writes the PNG (atomically); returns which renderer drew it ("matplotlib" or
    "builtin"). builtin=None takes matplotlib where it is installed."""
    c = curves(rows)
    use_builtin = not have_matplotlib() if builtin is None else builtin
    png = builtin_png(c, title) if use_builtin else matplotlib_png(c, title)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(png)
    tmp.replace(path)
    return "builtin" if use_builtin else "matplotlib"


def _smoothed_label(c: Curves) -> str:
    return f"smoothed ({c.window} steps)" if c.window > 1 else "smoothed"


def builtin_png(c: Curves, title: str) -> bytes:
    return builtin_canvas(c, title).png()


def builtin_canvas(c: Curves, title: str) -> plot_png.Canvas:
    S = plot_png.Series
    loss = [S("train", c.steps, c.loss, TRAIN)]
    if c.val_steps:
        loss.append(S("validation", c.val_steps, c.val_loss, VAL, markers=True))
    speed = [
        S("each step", c.steps, c.tokens_per_s, RAW),
        S(_smoothed_label(c), c.steps, c.tokens_per_s_smoothed, SMOOTH),
    ]
    return plot_png.render(title, [("loss", "nats/token", loss), ("throughput", "tokens/s", speed)])


def matplotlib_figure(c: Curves, title: str) -> Any:
    """The matplotlib Figure (no pyplot: no global state, no display needed)."""
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    def rgb(color: tuple[int, int, int]) -> tuple[float, ...]:
        return tuple(x / 255 for x in color)

    fig = Figure(figsize=(8, 6), dpi=100, layout="constrained")
    loss, speed = fig.subplots(2, 1, sharex=True)
    fig.suptitle(title)
    loss.plot(c.steps, c.loss, color=rgb(TRAIN), label="train")
    if c.val_steps:
        loss.plot(c.val_steps, c.val_loss, "o-", color=rgb(VAL), label="validation")
    loss.set_title("loss")
    loss.set_ylabel("loss (nats/token)")
    speed.plot(c.steps, c.tokens_per_s, color=rgb(RAW), label="each step")
    speed.plot(c.steps, c.tokens_per_s_smoothed, color=rgb(SMOOTH), label=_smoothed_label(c))
    speed.set_title("throughput")
    speed.set_ylabel("tokens/s")
    for ax in (loss, speed):
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.tick_params(labelbottom=True)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        ax.legend(loc="best")
    return fig


def matplotlib_png(c: Curves, title: str) -> bytes:
    import io

    from matplotlib.backends.backend_agg import FigureCanvasAgg

    fig = matplotlib_figure(c, title)
    FigureCanvasAgg(fig)
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()
