"""DistributedLogger: python logging with a rank filter (ColossalAI's).

    logger = get_dist_logger()
    logger.info("step 10, loss 2.31", ranks=[0])   # printed by rank 0 only
    logger.log_to_file("logs/")                      # logs/rank_<r>.log on every rank

Each call logs the caller's file, line and function, then the message (two
records, as ColossalAI does). The rank is megalith_comm's when it is initialized,
else torch.distributed's, else 0.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

_LEVELS = ("INFO", "DEBUG", "WARNING", "ERROR")
_FORMAT = "megalith - %(name)s - %(levelname)s: %(message)s"


def _rank() -> int:
    try:
        import megalith_comm

        if megalith_comm.is_initialized():
            return megalith_comm.get_world().rank
    except ImportError:
        pass
    import torch.distributed as dist

    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def _check_level(level: str) -> None:
    if level not in _LEVELS:
        raise ValueError(f"logging level {level!r}: expected one of {', '.join(_LEVELS)}")


class DistributedLogger:
    """One per name (get_dist_logger(name) returns it); writes to stderr, and to files
    added with log_to_file."""

    _instances: dict[str, DistributedLogger] = {}

    @staticmethod
    def get_instance(name: str) -> DistributedLogger:
        if name in DistributedLogger._instances:
            return DistributedLogger._instances[name]
        return DistributedLogger(name)

    def __init__(self, name: str) -> None:
        if name in DistributedLogger._instances:
            raise ValueError(
                f"a logger named {name!r} exists already; use megalith.logging.get_dist_logger"
                f"({name!r}) to get it"
            )
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter(_FORMAT))
        self._name = name
        self._logger = logging.getLogger(name)
        self._logger.setLevel(logging.INFO)
        self._logger.addHandler(handler)
        self._logger.propagate = False
        DistributedLogger._instances[name] = self

    @property
    def rank(self) -> int:
        return _rank()

    @property
    def name(self) -> str:
        return self._name

    def set_level(self, level: str) -> None:
        """INFO, DEBUG, WARNING or ERROR."""
        _check_level(level)
        self._logger.setLevel(getattr(logging, level))

    def log_to_file(
        self, path: str | Path, mode: str = "a", level: str = "INFO", suffix: str | None = None
    ) -> None:
        """Also writes records at `level` and above to <path>/rank_<rank>[_<suffix>].log
        (path is a directory, created if missing)."""
        if not isinstance(path, (str, Path)):
            raise TypeError(f"log_to_file: path must be a str or Path, got {type(path).__name__}")
        _check_level(level)
        folder = Path(path)
        folder.mkdir(parents=True, exist_ok=True)
        stem = f"rank_{self.rank}" + (f"_{suffix}" if suffix is not None else "")
        handler = logging.FileHandler(folder / f"{stem}.log", mode)
        handler.setLevel(getattr(logging, level))
        handler.setFormatter(logging.Formatter(_FORMAT))
        self._logger.addHandler(handler)

    def _log(self, level: str, message: str, ranks: list[int] | None) -> None:
        if ranks is not None and self.rank not in ranks:
            return
        caller = sys._getframe(2)  # the frame that called info/warning/debug/error
        code = caller.f_code
        write = getattr(self._logger, level)
        write(f"{code.co_filename}:{caller.f_lineno} {code.co_name}")
        write(message)

    def info(self, message: str, ranks: list[int] | None = None) -> None:
        """Logs message at INFO on the given ranks (None: every rank)."""
        self._log("info", message, ranks)

    def warning(self, message: str, ranks: list[int] | None = None) -> None:
        self._log("warning", message, ranks)

    def debug(self, message: str, ranks: list[int] | None = None) -> None:
        self._log("debug", message, ranks)

    def error(self, message: str, ranks: list[int] | None = None) -> None:
        self._log("error", message, ranks)
