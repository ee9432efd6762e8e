"""`megalith train`: the main job end to end, resume equal to an uninterrupted run, a kill
during a save, and bad options failing before anything starts."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from megalith.cli.main import main
from megalith.testing import run_grid
from megalith.train import state
from tests.cli.train_worker import resume_run

PLUGINS = ["ddp", "zero1", "zero2", "gemini"]
CLI = [sys.executable, "-m", "megalith", "train"]


def test_resume_equals_uninterrupted(tmp_path):
    """Stopped after step 7 (last checkpoint at 6), resumed: steps 7..12 repeat the
    uninterrupted run's losses bit for bit, under every plugin."""
    results = run_grid(resume_run, [(p, str(tmp_path)) for p in PLUGINS], 2, timeout=400)
    for plugin, per_rank in zip(PLUGINS, results):
        a, b = per_rank[0]
        assert [s for s, _ in a] == list(range(1, 13))
        assert [s for s, _ in b] == list(range(1, 13)), f"{plugin}: resumed run's steps {b}"
        assert a == b, f"{plugin}: losses differ after resume:\n{a}\n{b}"


@pytest.mark.timeout(300)
def test_cli_trains_and_reports(tmp_path):
    out = subprocess.run(
        [
            *CLI,
            "--steps",
            "40",
            "--batch-size",
            "8",
            "--seq-len",
            "64",
            "--eval-every",
            "20",
            "--save-every",
            "20",
            "--out",
            str(tmp_path),
            "--name",
            "smoke",
            "--nproc",
            "2",
        ],
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    run = tmp_path / "smoke"
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(1, 41))
    assert rows[-1]["loss"] < rows[0]["loss"] - 1.0, "the loss did not fall"
    assert all(r["tokens_per_s"] > 0 and r["peak_bytes"] > 0 for r in rows)
    assert (run / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert state.find(run) == run / "checkpoints" / "step_000040"
    for words in ("val loss", "unigram baseline", "tokens/s", "peak memory", "checkpoint"):
        assert words in out.stdout, out.stdout[-2000:]
    _loads_in_transformers(run / "checkpoints" / "step_000040" / "model")


def _loads_in_transformers(model_dir):
    """The checkpoint's model folder is a transformers model: same logits as ours."""
    transformers = pytest.importorskip("transformers")
    import torch

    from megalith import models

    hf = transformers.AutoModelForCausalLM.from_pretrained(model_dir).eval()
    ours = models.load_pretrained(model_dir).eval()
    ids = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.allclose(hf(ids).logits, ours(ids), atol=1e-5)


def _pids_with(text: str) -> list[int]:
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    if text.encode() in f.read():
                        pids.append(int(entry))
            except OSError:
                pass
    return pids


@pytest.mark.timeout(300)
def test_kill_during_save_resumes_from_last_complete(tmp_path):
    cmd = [
        *CLI,
        "--steps",
        "400",
        "--batch-size",
        "2",
        "--seq-len",
        "32",
        "--save-every",
        "1",
        "--eval-every",
        "1000",
        "--out",
        str(tmp_path),
        "--name",
        "k",
        "--nproc",
        "2",
    ]
    proc = subprocess.Popen(
        cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
    ckpts = tmp_path / "k" / "checkpoints"
    deadline = time.time() + 200
    try:
        while time.time() < deadline:  # wait for a few saves, then for one in progress
            done = list(ckpts.glob("step_*")) if ckpts.exists() else []
            if len(done) >= 3 and list(ckpts.glob(".tmp_step_*")):
                break
            time.sleep(0.02)
        else:
            pytest.fail("no checkpoint in progress seen")
    finally:
        # The launcher's ranks run in sessions of their own: kill them as well, at once.
        for pid in [proc.pid, *_pids_with(str(tmp_path))]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        proc.wait()
        time.sleep(0.5)
    found = state.find(tmp_path / "k")
    assert found is not None and (found / "trainer.json").exists()
    step = json.loads((found / "trainer.json").read_text())["step"]
    out = subprocess.run(
        [
            *cmd[:-8],
            "--steps",
            str(step + 2),
            "--eval-every",
            "1000",
            "--out",
            str(tmp_path),
            "--name",
            "k",
            "--nproc",
            "2",
            "--resume",
        ],
        capture_output=True,
        text=True,
        timeout=200,
    )
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    assert f"resumed at step {step}" in out.stdout


@pytest.mark.parametrize(
    ("words", "message"),
    [
        (["--offload", "cpu", "--swap-dir", "/tmp"], "--swap-dir /tmp is for --offload nvme"),
        (["--steps", "0"], "--steps 0; expected >= 1"),
        (["--offload", "auto"], "--offload auto on CPU ranks needs --device-budget-gb"),
        (["--device-budget-gb", "4"], "--device-budget-gb is for --offload auto"),
        (
            ["--offload", "nvme", "--master-tier", "nvme", "--offload", "host"],
            "--master-tier nvme is",
        ),
        (["--plugin", "zero9"], "invalid choice: 'zero9'"),
        (["--data", "/nonexistent/corpus.txt"], "no such file or directory"),
    ],
)
def test_bad_options_fail_with_the_fix(words, message, tmp_path, capfd):
    # In this process (the CLI's own main; test_cli_trains_and_reports runs `python -m
    # megalith train`): a fresh interpreter per case costs seconds of importing torch.
    try:
        code = main(["train", *words, "--nproc", "1", "--out", str(tmp_path)])
    except SystemExit as exit_:
        code = exit_.code
    out = capfd.readouterr()
    text = out.out + out.err + (code if isinstance(code, str) else "")
    assert code not in (0, None)
    assert message in text, text[-2000:]
