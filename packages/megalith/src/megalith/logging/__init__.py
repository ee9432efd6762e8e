"""megalith.logging: ColossalAI's rank-aware logger.

from megalith.logging import get_dist_logger
get_dist_logger().info("hello", ranks=[0])
"""

from __future__ import annotations

import logging

from .logger import DistributedLogger

__all__ = ["DistributedLogger", "disable_existing_loggers", "get_dist_logger"]


def get_dist_logger(name: str = "megalith") -> DistributedLogger:
    """The logger of that name (one per name in the process)."""
    return DistributedLogger.get_instance(name=name)


def disable_existing_loggers(
    include: list[str] | None = None, exclude: list[str] | None = None
) -> None:
    """Sets existing loggers to WARNING: those named in include, or (include=None) all but
    those in exclude (default: megalith's)."""
    exclude = ["megalith"] if exclude is None else exclude
    for name in list(logging.Logger.manager.loggerDict):
        if (name in include) if include is not None else (name not in exclude):
            logging.getLogger(name).setLevel(logging.WARNING)
