"""Without JAX installed, `import megalith.jax` fails with the command that fixes it,
and `import megalith` does not need JAX at all."""

from __future__ import annotations

import subprocess
import sys

SCRIPT = """
import sys
sys.modules["jax"] = None  # as if jax were not installed
import megalith
try:
    import megalith.jax
except ImportError as e:
    print("ERR", e)
"""


def test_import_error_names_the_install():
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120, check=True
    ).stdout
    assert out.startswith("ERR") and "pip install jax optax" in out and "megalith[jax]" in out
