"""ColossalAI's test decorators and helpers (colossalai.testing.utils), for megalith.

    @parameterize("dtype", [torch.float32, torch.bfloat16])
    @parameterize("shard", [True, False])
    def check(dtype, shard): ...        # check() runs 4 times, once per pair

    @rerun_if_address_is_in_use()
    def test_x(): spawn(run_dist, 2)

`spawn` and `free_port` live in spawn_ranks.py and spawn.py; they are re-exported here
because scripts import them from this module too.
"""

from __future__ import annotations

import gc
import inspect
import re
from collections.abc import Callable, Sequence
from typing import Any

from .spawn import free_port
from .spawn_ranks import spawn

__all__ = [
    "DummyDataloader",
    "clear_cache_before_run",
    "free_port",
    "parameterize",
    "rerun_if_address_is_in_use",
    "rerun_on_exception",
    "skip_if_not_enough_gpus",
    "spawn",
]


def _named_like(wrapper: Callable, func: Callable, signature: bool = True) -> Callable:
    """The wrapper takes func's name (pickling by name then finds the wrapper) and, unless
    signature=False, its signature (pytest.mark.parametrize reads it). parameterize's
    wrapper drops it: pytest must not take the parameterized argument for a fixture."""
    for attr in ("__module__", "__name__", "__qualname__", "__doc__"):
        if hasattr(func, attr):
            setattr(wrapper, attr, getattr(func, attr))
    if signature:
        wrapper.__signature__ = inspect.signature(func)
    return wrapper


def parameterize(argument: str, values: Sequence[Any]) -> Callable[[Callable], Callable]:
    """Calls the decorated function once per value, as func(**kwargs, argument=value).

    Other arguments must be passed by keyword. Stacked decorators give the cross product,
    the outermost argument varying slowest.
    """

    def decorate(func: Callable) -> Callable:
        def run_each(**kwargs: Any) -> None:
            for value in values:
                func(**kwargs, **{argument: value})

        return _named_like(run_each, func, signature=False)

    return decorate


def _matches(message: str, pattern: str | None) -> bool:
    return pattern is None or any(re.match(pattern, line) for line in message.split("\n"))


def rerun_on_exception(
    exception_type: type[BaseException] = Exception,
    pattern: str | None = None,
    max_try: int | None = 5,
) -> Callable[[Callable], Callable]:
    """Runs the function again, up to max_try times in all (None: until it succeeds), while
    it raises exception_type with a message line matching `pattern` (None: any message)."""
    if max_try is not None and (not isinstance(max_try, int) or max_try < 1):
        raise ValueError(f"rerun_on_exception: max_try={max_try!r}; pass a positive int or None")

    def decorate(func: Callable) -> Callable:
        def run_until_success(*args: Any, **kwargs: Any) -> Any:
            attempt = 0
            while True:
                attempt += 1
                try:
                    return func(*args, **kwargs)
                except exception_type as exc:
                    last = max_try is not None and attempt >= max_try
                    if last or not _matches(str(exc), pattern):
                        raise
                    print(
                        f"{func.__name__}: attempt {attempt} raised {type(exc).__name__}; retrying"
                    )

        return _named_like(run_until_success, func)

    return decorate


def rerun_if_address_is_in_use() -> Callable[[Callable], Callable]:
    """Reruns (up to 5 times) a test whose ranks failed because their port was taken."""
    return rerun_on_exception(Exception, pattern=r".*(A|a)ddress already in use.*")


def skip_if_not_enough_gpus(min_gpus: int) -> Callable[[Callable], Callable]:
    """Runs the function only when the accelerator has at least min_gpus devices; otherwise
    it does not run (under pytest the test is reported as skipped, with the count)."""

    def decorate(func: Callable) -> Callable:
        def run_if_enough(*args: Any, **kwargs: Any) -> Any:
            from megalith.accelerator import get_accelerator

            accelerator = get_accelerator()
            found = accelerator.device_count() if accelerator.name != "cpu" else 0
            if found >= min_gpus:
                return func(*args, **kwargs)
            try:
                import pytest
            except ImportError:  # pragma: no cover
                return None
            pytest.skip(f"needs {min_gpus} GPUs, found {found}")

        return _named_like(run_if_enough, func)

    return decorate


def clear_cache_before_run() -> Callable[[Callable], Callable]:
    """Empties the accelerator's cache, resets its peak-memory counters and collects
    garbage before each call (on CPU, the garbage collection is what remains)."""

    def decorate(func: Callable) -> Callable:
        def run_clean(*args: Any, **kwargs: Any) -> Any:
            from megalith.accelerator import get_accelerator

            accelerator = get_accelerator()
            accelerator.empty_cache()
            accelerator.reset_peak_memory_stats()
            accelerator.reset_max_memory_allocated()
            accelerator.reset_max_memory_cached()
            accelerator.synchronize()
            gc.collect()
            return func(*args, **kwargs)

        return _named_like(run_clean, func)

    return decorate


class DummyDataloader:
    """`length` batches, each a fresh data_gen_fn() call; iterable again after it ends."""

    def __init__(self, data_gen_fn: Callable[[], Any], length: int = 10) -> None:
        self.data_gen_fn = data_gen_fn
        self.length = length
        self.step = 0

    def __iter__(self) -> DummyDataloader:
        self.step = 0
        return self

    def __next__(self) -> Any:
        if self.step >= self.length:
            raise StopIteration
        self.step += 1
        return self.data_gen_fn()

    def __len__(self) -> int:
        return self.length
