"""`megalith train`'s options of issue 19 (deliverable 5): --grad-accum equal to one large
batch, --optimizer / --betas / --momentum, --lr-schedule / --min-lr against the lr that
metrics.jsonl records, --max-time and --keep-last, a run name in use refused unless
--overwrite or --resume, and --config (TOML, the command line overriding it, the
resolved options saved in the run directory). Bad values fail before any rank starts."""

from __future__ import annotations

import argparse
import math
import subprocess
import sys

import pytest
import tomllib

from megalith.testing import run_grid
from megalith.train import choices
from megalith.train import config as run_config
from megalith.train.options import add_options
from tests.cli.train_options_worker import accum_run, schedule_run, time_run

CLI = [sys.executable, "-m", "megalith", "train"]
SHORT = "--batch-size 2 --seq-len 16 --eval-batches 1 --warmup 1 --nproc 2".split()


def _parse(*words: str) -> argparse.Namespace:
    parser = run_config.ConfigParser()
    add_options(parser)
    return parser.parse_args(list(words))


@pytest.mark.timeout(300)
def test_grad_accum_equals_one_large_batch(tmp_path):
    """fp32, 2 ranks: 3 micro-batches of 2 sequences per step give the losses of one
    batch of 6 (the same tokens), step after step, under DDP, ZeRO-2 and Gemini."""
    plugins = ["ddp", "zero2", "gemini"]
    results = run_grid(accum_run, [(p, str(tmp_path)) for p in plugins], 2, timeout=250)
    for plugin, per_rank in zip(plugins, results):
        accum, big = per_rank[0]
        assert [s for s, _ in accum] == [1, 2, 3]
        assert accum[0][1] > 4.0, accum  # byte-level loss at init: ~ln(256)
        for (_, a), (_, b) in zip(accum, big):
            assert math.isclose(a, b, rel_tol=2e-5), f"{plugin}: {accum} != {big}"


@pytest.mark.timeout(300)
def test_optimizers_and_lr_schedules(tmp_path):
    settings = [
        ["--optimizer", "lion", "--betas", "0.8,0.9", "--lr", "1e-3", "--lr-schedule", "linear"],
        ["--optimizer", "sgd", "--momentum", "0.5", "--lr", "0.3", "--lr-schedule", "constant"],
        ["--optimizer", "adamw", "--min-lr", "1e-4", "--weight-decay", "0.0"],
    ]
    results = run_grid(schedule_run, [(w, str(tmp_path)) for w in settings], 2, timeout=250)
    for words, per_rank in zip(settings, results):
        rows = per_rank[0]
        assert len(rows) == 5, words
        for logged, expected, _ in rows:
            assert math.isclose(logged, expected, rel_tol=1e-9), (words, rows)
        losses = [loss for _, _, loss in rows]
        assert losses[-1] < losses[0], (words, losses)  # each optimizer trains
    lion_lrs = [lr for lr, _, _ in results[0][0]]
    assert lion_lrs == sorted(lion_lrs, reverse=True) and lion_lrs[-1] == pytest.approx(1e-4)
    assert {lr for lr, _, _ in results[1][0]} == {0.3}


def test_lr_factor_at_chosen_steps():
    a = _parse("--lr", "1.0", "--steps", "11", "--warmup", "1", "--min-lr", "0.2")
    cosine = choices.lr_factor(a)
    assert cosine(0) == 1.0 and cosine(6) == pytest.approx(0.6) and cosine(11) == 0.2
    linear = choices.lr_factor(_parse("--steps", "11", "--warmup", "2", "--lr-schedule", "linear"))
    assert linear(0) == 0.5 and linear(2) == 1.0 and linear(7) == pytest.approx(0.5)
    assert linear(20) == pytest.approx(0.1)  # the default --min-lr: a tenth of --lr
    assert choices.betas(_parse("--optimizer", "lion")) == (0.9, 0.99)


@pytest.mark.timeout(200)
def test_max_time_stops_saves_keep_last_prunes_overwrite_clears(tmp_path):
    first, again = run_grid(time_run, [str(tmp_path)], 2, timeout=150)[0][0]
    steps, left, latest = first
    last = steps[-1]
    assert 2 <= last < 500 and steps == list(range(1, last + 1)), steps
    assert left == [f"step_{last - 1:06d}", f"step_{last:06d}"], left
    assert latest == f"step_{last:06d}"
    assert again == ([1], ["latest", "step_000001"]), "--overwrite kept the earlier run's files"


@pytest.mark.timeout(300)
def test_config_file_name_in_use_and_max_time(tmp_path):
    """Through the CLI: the file's options with the command line's over them, the start
    line, the saved config, --max-time's summary line; then the name in use refused."""
    conf = tmp_path / "run.toml"
    conf.write_text('steps = 50\nseq_len = 16\ngrad-accum = 2\nlr-schedule = "linear"\n')
    words = [*CLI, "--config", str(conf), *SHORT, "--out", str(tmp_path), "--name", "c"]
    out = subprocess.run(
        [*words, "--steps", "30", "--max-time", "0.01", "--save-every", "100"],
        capture_output=True,
        text=True,
        timeout=200,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "x grad accum 2 = 8 sequences of 16 tokens" in out.stdout, out.stdout[-2000:]
    assert "--max-time 0.01 s reached after step 1" in out.stdout, out.stdout[-2000:]
    assert "  batch " in out.stdout and "2 x 2 rank(s) x grad accum 2" in out.stdout
    assert (tmp_path / "c" / "checkpoints" / "step_000001" / "trainer.json").exists()
    saved = tomllib.loads((tmp_path / "c" / "config.toml").read_text())
    assert saved["steps"] == 30 and saved["grad-accum"] == 2 and saved["lr-schedule"] == "linear"
    assert saved["batch-size"] == 2 and saved["max-time"] == 0.01 and "config" not in saved
    # the saved file is a config again, equal to what was run
    again = _parse("--config", str(tmp_path / "c" / "config.toml"))
    assert again.steps == 30 and again.grad_accum == 2 and again.max_norm == 1.0

    refused = subprocess.run(words, capture_output=True, text=True, timeout=100)
    assert refused.returncode != 0 and "Traceback" not in refused.stderr
    message = refused.stdout + refused.stderr
    assert "already holds a run; pass --resume to continue it, --overwrite" in message, message


BAD = [
    (["--grad-accum", "0"], "--grad-accum 0; expected >= 1"),
    (["--betas", "0.9"], "--betas 0.9; expected two numbers in [0, 1)"),
    (["--optimizer", "sgd", "--betas", "0.9,0.9"], "sgd takes --momentum"),
    (["--lr-schedule", "constant", "--min-lr", "0.1"], "--min-lr is for --lr-schedule"),
    (["--keep-last", "0"], "--keep-last 0; expected >= 1"),
    (["--max-time", "-1"], "--max-time -1.0; expected a positive"),
    (["--resume", "--overwrite"], "--overwrite with --resume"),
    (["--momentum", "1.5", "--optimizer", "sgd"], "--momentum 1.5; expected a number in [0, 1)"),
    (["--plugin", "auto", "--grad-accum", "2"], "--grad-accum with --plugin auto"),
    (["--save-every", "-1"], "--save-every -1; expected >= 1 steps, or 0 for none"),
    (["--save-every", "0", "--resume"], "--save-every 0 with --resume"),
]


def test_save_every_zero_is_accepted():
    choices.check(_parse("--save-every", "0"))  # no checkpoints at all (benchmarks)


@pytest.mark.parametrize(("words", "message"), BAD)
def test_bad_values_named(words, message):
    with pytest.raises(ValueError) as e:
        choices.check(_parse(*words))
    assert message in str(e.value)


@pytest.mark.parametrize(
    ("words", "message"),
    [(BAD[0][0], BAD[0][1]), (["--config", "/nonexistent.toml"], "No such file or directory")],
)
def test_bad_values_fail_in_one_line_before_the_ranks(words, message, tmp_path):
    out = subprocess.run(
        [*CLI, *words, "--nproc", "1", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode != 0 and "Traceback" not in out.stderr, out.stderr[-2000:]
    assert message in out.stdout + out.stderr, out.stdout[-2000:] + out.stderr[-2000:]


def test_config_unknown_key_and_bad_value_refused(tmp_path):
    conf = tmp_path / "bad.toml"
    conf.write_text("stepz = 3\n")
    with pytest.raises(SystemExit):
        _parse("--config", str(conf))
    with pytest.raises(ValueError, match="unknown key 'stepz'"):
        run_config.load(str(conf), _options_parser())
    conf.write_text('optimizer = "adam"\n')
    with pytest.raises(ValueError, match="optimizer = 'adam'; expected one of adamw"):
        run_config.load(str(conf), _options_parser())
    conf.write_text("resume = true\n")
    with pytest.raises(ValueError, match="'resume' is for the command line"):
        run_config.load(str(conf), _options_parser())
    conf.write_text("steps = 3\nbatch_size = 5\n")
    parsed = _parse("--config", str(conf), "--steps", "7")
    assert parsed.steps == 7 and parsed.batch_size == 5  # the command line wins


def _options_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    add_options(parser)
    return parser
