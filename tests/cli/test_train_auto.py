"""`megalith train --plugin auto`: a few steps on the built-in corpus with a tiny preset
write a valid runs/NAME/plan.json and a summary of predicted against measured step time
and peak memory; offload options it decides itself are refused before any rank starts."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from megalith.cli.main import main

KEYS = (
    "dp", "tp", "pp", "sp", "zero_stage", "offload", "micro_batch", "num_microbatches", "ckpt",
    "schedule", "predicted_step_s", "predicted_tokens_per_s", "predicted_peak_bytes",
)  # fmt: skip


@pytest.mark.timeout(200)
def test_train_auto_writes_its_plan_and_compares(tmp_path):
    words = "--plugin auto --steps 4 --batch-size 4 --seq-len 32 --eval-every 4 --save-every 4"
    words += " --eval-batches 1 --warmup 1 --nproc 2 --name auto --out"
    out = subprocess.run(
        [sys.executable, "-m", "megalith", "train", *words.split(), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    run = tmp_path / "auto"
    plan = json.loads((run / "plan.json").read_text())
    chosen = plan["chosen"]
    assert set(KEYS) <= set(chosen), sorted(chosen)
    assert plan["candidates"] and all(set(KEYS) <= set(c) for c in plan["candidates"])
    steps = [chosen["predicted_step_s"], *(c["predicted_step_s"] for c in plan["candidates"])]
    assert steps == sorted(steps) and steps[0] > 0
    assert chosen["dp"] * chosen["tp"] * chosen["pp"] * chosen["sp"] == 2
    assert chosen["dp"] * chosen["micro_batch"] * chosen["num_microbatches"] == 8
    assert chosen["predicted_peak_bytes"] > 0 and plan["global_batch_tokens"] == 8 * 32
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    text = out.stdout
    assert f"plugin auto -> {chosen['plugin']}" in text, text[-2000:]
    step_line = next(line for line in text.splitlines() if "step, planned" in line)
    measured = rows[-1]["step_s"] * 1e3  # the summary's steady rows: the last one here
    assert f"predicted {chosen['predicted_step_s'] * 1e3:.1f} ms" in step_line, step_line
    assert f"measured {measured:.1f} ms" in step_line, step_line
    peak_line = next(line for line in text.splitlines() if "peak / rank, planned" in line)
    assert "predicted" in peak_line and "peak RSS" in peak_line, peak_line


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--offload", "host"], "--offload host with --plugin auto, which chooses offloading"),
        (["--optim-frac", "0.5"], "--optim-frac 0.5 with --plugin auto"),
        (["--device-budget-gb", "-1"], "--device-budget-gb -1.0; expected a positive size"),
    ],
)
def test_train_auto_refuses_what_it_chooses(extra, message, capsys):
    with pytest.raises(SystemExit) as e:
        main(["train", "--plugin", "auto", "--nproc", "2", *extra])
    assert message in str(e.value), str(e.value)
