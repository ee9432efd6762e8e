"""Timer and MultiTimer: wall-clock timing that waits for the device first (ColossalAI's)."""

from __future__ import annotations

import time
from collections.abc import Iterator


def _sync() -> None:
    from megalith.accelerator import get_accelerator

    get_accelerator().synchronize()


class Timer:
    """start(), lap(), stop(keep_in_history); the history's mean and sum, in seconds."""

    def __init__(self) -> None:
        self._started = False
        self._start_time = time.time()
        self._elapsed = 0.0
        self._history: list[float] = []

    @property
    def has_history(self) -> bool:
        return len(self._history) != 0

    @property
    def current_time(self) -> float:
        _sync()
        return time.time()

    def start(self) -> None:
        self._elapsed = 0.0
        _sync()
        self._start_time = time.time()
        self._started = True

    def lap(self) -> float:
        """Seconds since start(), the timer still running."""
        return self.current_time - self._start_time

    def stop(self, keep_in_history: bool = False) -> float:
        _sync()
        elapsed = time.time() - self._start_time
        if keep_in_history:
            self._history.append(elapsed)
        self._elapsed = elapsed
        self._started = False
        return elapsed

    def get_history_mean(self) -> float:
        if not self._history:
            raise ValueError("Timer.get_history_mean: no history; stop(keep_in_history=True) first")
        return sum(self._history) / len(self._history)

    def get_history_sum(self) -> float:
        return sum(self._history)

    def get_elapsed_time(self) -> float:
        """The last start-stop interval; the timer must be stopped."""
        if self._started:
            raise RuntimeError("Timer.get_elapsed_time: the timer is still running; stop() it")
        return self._elapsed

    def reset(self) -> None:
        self._history = []
        self._started = False
        self._elapsed = 0.0


class MultiTimer:
    """Named Timers, all switched on or off together (on=False: every call does nothing)."""

    def __init__(self, on: bool = True) -> None:
        self._on = on
        self._timers: dict[str, Timer] = {}

    def start(self, name: str) -> None:
        if self._on:
            self._timers.setdefault(name, Timer()).start()

    def stop(self, name: str, keep_in_history: bool) -> float | None:
        return self._timers[name].stop(keep_in_history) if self._on else None

    def get_timer(self, name: str) -> Timer:
        return self._timers[name]

    def reset(self, name: str | None = None) -> None:
        if self._on:
            for timer in [self._timers[name]] if name is not None else self._timers.values():
                timer.reset()

    def is_on(self) -> bool:
        return self._on

    def set_status(self, mode: bool) -> None:
        self._on = mode

    def __iter__(self) -> Iterator[tuple[str, Timer]]:
        yield from self._timers.items()
