"""Checkpoints per plugin: each plugin gives its CheckpointIO, the Booster hands every
checkpoint call to it, and a TorchDDPPlugin checkpoint needs no megalith-zero."""

from __future__ import annotations

from unittest import mock

import pytest

from megalith.booster import (
    Booster,
    GeminiPlugin,
    HybridParallelPlugin,
    LowLevelZeroPlugin,
    Plugin,
    TorchDDPPlugin,
)
from megalith.booster.checkpoint_io import (
    CheckpointIO,
    GeminiCheckpointIO,
    GeneralCheckpointIO,
    HybridParallelCheckpointIO,
    LowLevelZeroCheckpointIO,
    ZeroCheckpointIO,
)
from megalith.booster.checkpoint_io.tp_layout import tp_layout
from megalith.testing import run_distributed
from tests.booster.checkpoint_io_workers import ddp_round_trip_without_zero


@pytest.mark.parametrize(
    ("plugin", "kind", "layout_for"),
    [
        (TorchDDPPlugin(), GeneralCheckpointIO, None),
        (LowLevelZeroPlugin(stage=2), LowLevelZeroCheckpointIO, None),
        (GeminiPlugin(), GeminiCheckpointIO, None),
        (GeminiPlugin(tp_size=2), GeminiCheckpointIO, tp_layout),
        (HybridParallelPlugin(tp_size=2), HybridParallelCheckpointIO, None),
        (HybridParallelPlugin(tp_size=2, zero_stage=1), ZeroCheckpointIO, tp_layout),
        (HybridParallelPlugin(tp_size=1, zero_stage=2), ZeroCheckpointIO, None),
        (
            HybridParallelPlugin(tp_size=1, pp_size=2, zero_stage=1, num_microbatches=2),
            HybridParallelCheckpointIO,
            None,
        ),
    ],
    ids=["ddp", "zero2", "gemini", "gemini-tp", "tp", "tp-zero", "zero-no-tp", "pp-zero"],
)
def test_each_plugin_gives_its_checkpoint_io(plugin, kind, layout_for):
    io = plugin.get_checkpoint_io()
    assert type(io) is kind
    assert getattr(io, "layout_for", None) is layout_for


def test_booster_hands_every_checkpoint_call_to_the_plugins_io():
    io = mock.create_autospec(CheckpointIO, instance=True)

    class Custom(Plugin):
        def get_checkpoint_io(self) -> CheckpointIO:
            return io

    booster = Booster(plugin=Custom())
    assert booster.checkpoint_io is io
    booster.save_model("m", "ckpt/model", shard=True, size_per_shard=7)
    booster.load_model("m", "ckpt/model", strict=False)
    booster.save_optimizer("o", "ckpt/optim", shard=True, size_per_shard=3)
    booster.load_optimizer("o", "ckpt/optim")
    booster.save_lr_scheduler("s", "ckpt/sched.json")
    booster.load_lr_scheduler("s", "ckpt/sched.json")
    io.save_model.assert_called_once_with(
        "m",
        "ckpt/model",
        shard=True,
        gather_dtensor=True,
        prefix=None,
        size_per_shard=7,
        use_safetensors=False,
        use_async=False,
    )
    io.load_model.assert_called_once_with(
        "m", "ckpt/model", strict=False, low_cpu_mem_mode=True, num_threads=1
    )
    io.save_optimizer.assert_called_once_with(
        "o",
        "ckpt/optim",
        shard=True,
        gather_dtensor=True,
        prefix=None,
        size_per_shard=3,
        use_async=False,
    )
    io.load_optimizer.assert_called_once_with(
        "o", "ckpt/optim", low_cpu_mem_mode=True, num_threads=1
    )
    io.save_lr_scheduler.assert_called_once_with("s", "ckpt/sched.json")
    io.load_lr_scheduler.assert_called_once_with("s", "ckpt/sched.json")


def test_a_plugin_without_its_own_io_gets_the_general_one():
    class Custom(Plugin):
        pass

    assert type(Custom().get_checkpoint_io()) is GeneralCheckpointIO


def test_ddp_checkpoints_round_trip_without_megalith_zero(tmp_path):
    per_rank = run_distributed(ddp_round_trip_without_zero, 2, str(tmp_path), timeout=120)
    for rank, result in enumerate(per_rank):
        assert result == {
            "model.safetensors": True,
            "model": True,
            "left over": [],  # no staging directory, no temporary file, on any rank
            "megalith_zero": False,
        }, f"rank {rank}: {result}"
