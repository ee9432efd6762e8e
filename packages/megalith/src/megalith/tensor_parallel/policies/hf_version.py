"""Which transformers releases the policies for its models are tested with.

The policies read a handful of attribute names (GPT2Attention.split_size,
LlamaAttention.num_key_value_groups, the module paths). Those held across the 5.x
releases; another major release gets a warning naming the tested one rather than
a refusal, since pinning one release is what breaks users on every upgrade.
"""

from __future__ import annotations

import warnings

TESTED_MAJOR = 5


def check_transformers() -> None:
    import transformers

    version = transformers.__version__
    major = int(version.split(".")[0])
    if major < TESTED_MAJOR:
        raise ValueError(
            f"megalith.tensor_parallel's transformers policies need transformers "
            f">= {TESTED_MAJOR}.0 (tested with {TESTED_MAJOR}.x); installed: {version}. "
            f"pip install 'transformers>={TESTED_MAJOR},<{TESTED_MAJOR + 1}'"
        )
    if major > TESTED_MAJOR:
        warnings.warn(
            f"transformers {version} is newer than the {TESTED_MAJOR}.x the tensor-parallel "
            "policies are tested with; run tests/test_tp_policies.py to check it",
            stacklevel=3,
        )
