"""Whether this torch builds and runs models on the meta device (shapes and dtypes, no
memory): what lazy initialisation (megalith.lazy) and shape tracing rely on."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

import torch

F = TypeVar("F", bound=Callable[..., Any])


@functools.cache
def is_compatible_with_meta() -> bool:
    """True when a module can be built on the meta device and run there, gradients
    included (torch >= 1.12); tried once, on a small Linear + LayerNorm."""
    try:
        layer = torch.nn.Sequential(
            torch.nn.Linear(4, 3, device="meta"), torch.nn.LayerNorm(3, device="meta")
        )
        out = layer(torch.empty(2, 4, device="meta"))
        out.sum().backward()
        return out.is_meta and tuple(out.shape) == (2, 3) and layer[0].weight.grad.is_meta
    except (RuntimeError, NotImplementedError, TypeError):
        return False


def compatibility(is_backward_compatible: bool = False) -> Callable[[F], F]:
    """Marks a function that needs meta tensors: where this torch lacks them, calling it
    raises (unless is_backward_compatible)."""

    def decorate(func: F) -> F:
        if is_backward_compatible or is_compatible_with_meta():
            return func

        @functools.wraps(func)
        def refused(*args: Any, **kwargs: Any) -> Any:
            raise RuntimeError(
                f"{func.__name__} needs meta tensors, which torch {torch.__version__} cannot "
                "run: upgrade torch to 1.12 or newer"
            )

        return refused  # type: ignore[return-value]

    return decorate
