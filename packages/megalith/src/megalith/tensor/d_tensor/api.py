"""`clear_layout_converter`: ColossalAI's tests call it between cases to drop the cached
layout-conversion plans of its distributed tensors. megalith's tensor-parallel shards
carry their layout on the parameter (tp_spec) and convert nothing through a cache, so
there is nothing to clear."""

from __future__ import annotations


def clear_layout_converter() -> None:
    """Nothing to clear: megalith keeps no layout-conversion cache."""


__all__ = ["clear_layout_converter"]
