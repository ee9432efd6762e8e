"""ColossalAI's PipelinePluginBase (colossalai.booster.plugin.pp_plugin_base): a plugin
that runs a step through execute_pipeline. HybridParallelPlugin is one."""

from __future__ import annotations

import abc
from collections.abc import Callable, Iterator
from typing import Any

from .base import Plugin


class PipelinePluginBase(Plugin, abc.ABC):
    @abc.abstractmethod
    def execute_pipeline(
        self,
        data_iter: Iterator,
        model: Any,
        criterion: Callable[[Any, Any], Any],
        optimizer: Any = None,
        return_loss: bool = True,
        return_outputs: bool = False,
    ) -> Any:
        """One training step over the next batch of data_iter."""


__all__ = ["PipelinePluginBase"]
