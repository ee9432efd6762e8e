"""`megalith train`'s observability of issue 19 (deliverable 5): MFU in metrics.jsonl
(the traced FLOPs per token against 6N, over the profile's peak), TensorBoard events
read back equal to metrics.jsonl, --compile's losses equal to the eager run's under DDP
and ZeRO-2, and the options refused before any rank starts."""

from __future__ import annotations

import argparse
import math

import pytest

from megalith.autoparallel.profiles import load_profile
from megalith.testing import run_grid
from megalith.train import choices, mfu, tensorboard_log
from megalith.train import config as run_config
from megalith.train.options import add_options
from tests.cli.train_observe_worker import eager_and_compiled

PLUGINS = ["ddp", "zero2"]


def _parse(*words: str) -> argparse.Namespace:
    parser = run_config.ConfigParser()
    add_options(parser)
    return parser.parse_args(list(words))


def _events(folder) -> dict[str, list[tuple[int, float]]]:
    accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
    acc = accumulator.EventAccumulator(str(folder))
    acc.Reload()
    return {t: [(e.step, e.value) for e in acc.Scalars(t)] for t in acc.Tags()["scalars"]}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    if not tensorboard_log.available():
        pytest.skip("tensorboard is not installed (pip install tensorboard)")
    root = tmp_path_factory.mktemp("observe")
    env = {"MEGALITH_PROFILE": "ci_cpu"}  # a CPU peak for MFU
    rows, traced, n = run_grid(eager_and_compiled, [str(root)], 2, timeout=250, env=env)[0][0]
    return root, rows, traced, n


@pytest.mark.timeout(300)
def test_compiled_losses_equal_eager(runs):
    _, rows, _, _ = runs
    eager = rows["eager"]
    assert eager[0]["loss"] > 4.0  # byte-level loss at init: ~ln(256)
    for name in ("compiled-ddp", "compiled-zero2"):
        compiled = rows[name]
        assert [r["step"] for r in compiled] == [1, 2, 3]
        for a, b in zip(eager, compiled, strict=True):
            assert math.isclose(a["loss"], b["loss"], rel_tol=2e-5), (name, eager, compiled)
        assert math.isclose(eager[-1]["val_loss"], compiled[-1]["val_loss"], rel_tol=2e-5)


def test_mfu_and_grad_norm_in_metrics(runs):
    _, rows, (per_token, source), n = runs
    assert source == "traced" and 0.9 * 6 * n < per_token < 1.1 * 6 * n, (per_token, 6 * n)
    peak = max(load_profile("ci_cpu").matmul["fp32"].values())
    for r in rows["eager"]:
        assert r["mfu"] == pytest.approx(per_token * r["tokens_per_s"] / (2 * peak), rel=1e-9)
        assert r["grad_norm"] > 0 and math.isfinite(r["grad_norm"])


def test_tensorboard_events_equal_metrics(runs):
    root, rows, _, _ = runs
    events = _events(root / "eager" / "tensorboard")
    for key, (tag, scale) in tensorboard_log.TAGS.items():
        expected = [(r["step"], r[key] * scale) for r in rows["eager"] if key in r]
        assert expected, key
        got = events[tag]
        assert [s for s, _ in got] == [s for s, _ in expected], (tag, got)
        for (_, a), (_, b) in zip(got, expected, strict=True):
            assert a == pytest.approx(b, rel=1e-6), tag  # stored as float32
    assert not (root / "compiled-ddp" / "tensorboard").exists()


@pytest.mark.parametrize(
    ("words", "message"),
    [
        (
            ["--compile", "--plugin", "gemini"],
            "--compile with --plugin gemini: torch.compile runs under ddp, zero1, zero2",
        ),
        (["--compile", "--plugin", "auto"], "--compile with --plugin auto"),
        (["--compile", "tvm"], "--compile tvm; expected one of inductor, aot_eager, eager"),
    ],
)
def test_compile_refused_where_the_plugin_does_not_allow(words, message):
    with pytest.raises(ValueError) as e:
        choices.check(_parse(*words))
    assert message in str(e.value)
    choices.check(_parse("--compile", "--plugin", "zero1"))


def test_compile_in_a_config_file(tmp_path):
    conf = tmp_path / "c.toml"
    conf.write_text("compile = true\ntensorboard = true\n")
    parsed = _parse("--config", str(conf))
    assert parsed.compile == "inductor" and parsed.tensorboard is True
    conf.write_text('compile = "aot_eager"\n')
    assert _parse("--config", str(conf)).compile == "aot_eager"
    conf.write_text("compile = false\n")
    assert _parse("--config", str(conf)).compile is None


def test_tensorboard_missing_fails_in_one_line_before_the_ranks(tmp_path, monkeypatch):
    from megalith.cli import train as cli_train
    from megalith.cli.main import build_parser

    monkeypatch.setattr(tensorboard_log, "available", lambda: False)
    monkeypatch.delenv("RANK", raising=False)
    parsed = build_parser().parse_args(["train", "--tensorboard", "--out", str(tmp_path)])
    with pytest.raises(SystemExit) as e:
        cli_train.run(parsed)
    assert str(e.value) == (
        "megalith train: --tensorboard needs the tensorboard package (torch.utils.tensorboard "
        "writes through it): pip install tensorboard"
    )
    assert not any(tmp_path.iterdir())  # no rank ran


def test_mfu_peaks_and_words():
    assert mfu.gpu_peak("NVIDIA H100 PCIe") == 756e12
    assert mfu.gpu_peak("NVIDIA H200") == 989e12 and mfu.gpu_peak("Some NPU") is None
    meter = mfu.Meter(5e6, "traced", 1e11, "profile vm, fp32 matmul", 2)
    assert meter.of(4000.0) == pytest.approx(5e6 * 4000 / 2e11)
    assert meter.words(4000.0).startswith("10.0% (5.00 MFLOP/token (traced) x 4,000 tokens/s")
    unknown = mfu.Meter(5e6, "6N", None, "no peak known for cpu", 2)
    assert unknown.of(4000.0) is None and unknown.words(4000.0).startswith("n/a (5.00")


def test_tensorboard_resume_drops_the_steps_after_the_checkpoint(tmp_path):
    pytest.importorskip("tensorboard")
    first = tensorboard_log.TensorBoardLog(tmp_path)
    for step in range(1, 5):
        first.write({"step": step, "loss": 5.0 - step, "val_loss": None})
    first.close()
    again = tensorboard_log.TensorBoardLog(tmp_path, resumed_at=2)  # trained again from 3
    for step in (3, 4):
        again.write({"step": step, "loss": 10.0 + step})
    again.close()
    assert _events(tmp_path / "tensorboard")["loss/train"] == [
        (1, 4.0),
        (2, 3.0),
        (3, 13.0),
        (4, 14.0),
    ]
