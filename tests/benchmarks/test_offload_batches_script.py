"""The offload benchmark at a number of tokens per optimizer step (benchmarks/zero/
gpu_gpt.py --tokens-per-step, run by benchmarks/device/offload_batches.sh) on one CPU
rank with a one-layer gpt-tiny: plain torch and ZeRO-2 with every master and state on
the host run their micro-batches end to end, so a GPU session's time is not spent
finding a broken script."""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path

import pytest

from megalith.testing import run_distributed

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "zero" / "gpu_gpt.py"


def _main(rank: int, argv: list[str]) -> None:
    spec = importlib.util.spec_from_file_location("gpu_gpt", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    sys.argv = [str(SCRIPT), *argv]
    module.main()


def _rows(text: str) -> dict[str, list[str]]:
    cells = [line.strip("|").split("|") for line in text.splitlines() if line.startswith("| ")]
    return {(c[0].strip(), c[1].strip()): [x.strip() for x in c[2:]] for c in cells[1:]}


def test_tokens_per_step_accumulates_micro_batches(tmp_path):
    out = tmp_path / "rows.md"
    argv = ["--model", "gpt-tiny", "--layers", "1", "--seq", "16", "--batch", "2"]
    argv += ["--tokens-per-step", "32,96", "--steps", "1", "--warmup", "1"]
    argv += ["--modes", "torch,zero2-offload", "--out", str(out)]
    run_distributed(_main, 1, argv, timeout=120)
    text = out.read_text()
    assert "tokens per step 32 (1 micro-batches), 96 (3 micro-batches)" in text, text
    rows = _rows(text)
    assert set(rows) == {
        ("torch", "32"),
        ("torch", "96"),
        ("zero2-offload", "32"),
        ("zero2-offload", "96"),
    }, text
    for cells in rows.values():
        tokens_per_s, ratio, tflops, loss = cells[0], cells[1], cells[2], cells[-1]
        assert float(tokens_per_s.replace(",", "")) > 0 and float(tflops) >= 0, text
        assert ratio.endswith("x"), text  # against plain torch at the same tokens per step
        # a random gpt-tiny after a step or two: about ln(vocab), finite
        assert abs(float(loss) - math.log(50304)) < 1.0, text
    # the same data and the same updates: bf16 autocast against bf16 ZeRO working params
    for tokens in ("32", "96"):
        torch_loss, zero_loss = rows["torch", tokens][-1], rows["zero2-offload", tokens][-1]
        assert float(torch_loss) == pytest.approx(float(zero_loss), abs=0.05), text


def test_tokens_per_step_must_be_whole_micro_batches():
    spec = importlib.util.spec_from_file_location("gpu_gpt", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.micro_batches(0, 8, 2048) == 1
    assert module.micro_batches(163840, 8, 2048) == 10
    with pytest.raises(SystemExit, match="pass a multiple of 16384"):
        module.micro_batches(20000, 8, 2048)
