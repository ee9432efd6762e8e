"""run_on_environment_flag (colossalai.testing.pytest_wrapper): tests run only on request.

@run_on_environment_flag(name="SLOW_TESTS")
def test_big(): ...        # runs under SLOW_TESTS=1 pytest ..., else skipped
"""

from __future__ import annotations

import os
from typing import Any

__all__ = ["run_on_environment_flag"]


def run_on_environment_flag(name: str) -> Any:
    """A pytest skip mark that lets the test run only when the variable name (upper-cased)
    is "1"."""
    if not isinstance(name, str):
        raise TypeError(f"run_on_environment_flag: name={name!r}; pass the variable's name")
    try:
        import pytest
    except ImportError:
        raise ImportError("run_on_environment_flag needs pytest: pip install pytest") from None
    flag = os.environ.get(name.upper(), "0")
    return pytest.mark.skipif(flag != "1", reason=f"runs only with {name.upper()}=1 (it is {flag})")
