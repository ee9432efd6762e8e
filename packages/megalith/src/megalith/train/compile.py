"""`megalith train --compile [BACKEND]`: torch.compile of the model, under the plugins
that keep the user's modules and parameters as they are (ddp, zero1, zero2: gradients
leave the compiled backward through the ordinary autograd hooks the plugin registers).
Gemini gathers and frees parameter shards in module hooks and hybrid swaps in
tensor-parallel layers, which the compiled graph would bake in; --plugin auto does not
know its plugin before the plan. Those are refused before any rank starts.

The model is compiled in place (nn.Module.compile), so its state-dict names and the
checkpoints stay those of the eager model. The backend defaults to inductor; tests on
CPU ranks take aot_eager (autograd traced the same way, without inductor's code
generation, which takes minutes on two cores)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

PLUGINS = ("ddp", "zero1", "zero2")
BACKENDS = ("inductor", "aot_eager", "eager")


def check(args: argparse.Namespace) -> None:
    """ValueError when --compile cannot run under the chosen plugin."""
    backend = getattr(args, "compile", None)
    if not backend:
        return
    plugin = getattr(args, "plugin", None)
    if plugin not in PLUGINS:
        raise ValueError(
            f"--compile with --plugin {plugin}: torch.compile runs under "
            f"{', '.join(PLUGINS)} (its parameters stay the model's own); drop --compile "
            "or choose one of those plugins"
        )
    if backend not in BACKENDS:
        raise ValueError(f"--compile {backend}; expected one of {', '.join(BACKENDS)}")


def apply(model: torch.nn.Module, backend: str) -> torch.nn.Module:
    """Compiles model in place (tracing happens at the first forward) and returns it."""
    model.compile(backend=backend)
    return model
