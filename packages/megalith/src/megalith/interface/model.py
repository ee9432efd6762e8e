"""AMPModelMixin: the hook a boosted model with fp32 master weights offers (ColossalAI's)."""

from __future__ import annotations


class AMPModelMixin:
    """A model trained in low precision from fp32 master weights mixes this in;
    update_master_params() copies the working (low precision) weights into the
    masters after the user changed them outside the optimizer (e.g. loaded them).
    Models whose masters are their own parameters have nothing to copy."""

    def update_master_params(self) -> None:
        """Nothing to do by default: the parameters are the masters."""
