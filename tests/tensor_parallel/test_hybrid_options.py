"""HybridParallelPlugin's gradient_checkpoint_config (layers recomputed in backward, the
ratio honoured) and cpu_offload (ZeRO's states on the host), each equal to the whole
model trained in one process."""

from __future__ import annotations

import pytest

from megalith.booster import GradientCheckpointConfig
from megalith.booster.plugin import HybridParallelPlugin
from tests.tensor_parallel.hybrid_options import OptionsCase
from tests.tensor_parallel.models import run_cases


@pytest.mark.timeout(300)
def test_checkpointing_and_offload_at_world_2():
    run_cases(
        [
            OptionsCase(ratio=1.0),
            OptionsCase(family="llama", ratio=0.5),
            OptionsCase(family="megalith-gpt", ratio=0.5),
            OptionsCase(family="llama", tp=1, zero_stage=2, cpu_offload=True, ratio=1.0),
        ],
        2,
        timeout=280,
    )


@pytest.mark.timeout(400)
def test_checkpointing_and_offload_at_world_4():
    run_cases(
        [
            OptionsCase(family="llama", zero_stage=2, cpu_offload=True, ratio=1.0),
            OptionsCase(family="llama", pp=2, zero_stage=1, cpu_offload=True, ratio=1.0),
            OptionsCase(pp=2, ratio=0.5),
        ],
        4,
        timeout=380,
    )


def test_bad_options_fail_at_construction():
    with pytest.raises(ValueError, match="zero_stage=1 or 2"):
        HybridParallelPlugin(tp_size=2, cpu_offload=True)
    with pytest.raises(ValueError, match=r"in \(0, 1\]"):
        GradientCheckpointConfig(1.5)
    with pytest.raises(TypeError, match="GradientCheckpointConfig"):
        HybridParallelPlugin(tp_size=2, gradient_checkpoint_config="all")
