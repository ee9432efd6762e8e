"""All-to-all (Ulysses) sequence parallelism for transformers' LlamaForCausalLM (and the
Mistral, Qwen2 and Qwen3 ones) under
HybridParallelPlugin(sp_size > 1, sequence_parallelism_mode="all_to_all"), as ColossalAI's
llama benchmark runs it (`--sp 2 --sp_mode all_to_all`): losses and parameters after two
SGD steps equal the plain model's in one process, on 2 ranks (sp 2, a padded batch) and
on 4 (sp 4; sp 2 beside tp 2); and the refusal of other models names them in full."""

from __future__ import annotations

import pytest
import torch

from megalith.testing import run_distributed
from tests.colossalai import ulysses_hf_workers as uw


@pytest.mark.timeout(90)
def test_transformers_llama_all_to_all_on_2_ranks_matches_torch():
    # Mistral and Qwen2 slide a window shorter than the sequence over the whole sequence
    settings = [
        (2, 1, True),
        (2, 1, True, "Mistral"),
        (2, 1, True, "Qwen2"),
        (2, 1, False, "Qwen3"),
    ]
    for errors in run_distributed(uw.ulysses_grid, 2, settings, 5, timeout=80):
        assert errors == []


@pytest.mark.timeout(120)
def test_transformers_llama_all_to_all_on_4_ranks_matches_torch():
    settings = [(4, 1, False), (2, 2, True), (2, 2, False, "Qwen3")]
    for errors in run_distributed(uw.ulysses_grid, 4, settings, 6, timeout=110):
        assert errors == []


def test_other_models_are_refused_by_their_full_name():
    from megalith.tensor_parallel.ulysses import validate_ulysses

    with pytest.raises(ValueError) as err:
        validate_ulysses(torch.nn.Linear(2, 2), 2)
    msg = str(err.value)  # it named LlamaForCausalLM twice (megalith's and "not" the user's)
    assert "not torch.nn.modules.linear.Linear" in msg and "split_gather" in msg
    assert "megalith.models.LlamaForCausalLM and transformers' LlamaForCausalLM" in msg
    with pytest.raises(
        ValueError, match=r"sp_size 3 .* divide the number of attention heads \(4\)"
    ):
        validate_ulysses(uw.llama(), 3)
