"""megalith.jax: the engine's fused optimizers for JAX, as optax GradientTransformations.

``megalith.jax.adamw``, ``lion`` and ``sgd`` take optax's own arguments and replace
``optax.adamw`` / ``optax.lion`` / ``optax.sgd`` unchanged; ``offloaded_adamw`` keeps the
fp32 master and both moments in the engine's (pinned) host memory and never reads the
parameters back. ``zero1_adamw`` is AdamW for data parallelism with the state sharded
over the ranks (ZeRO-1); ``all_reduce``, ``reduce_scatter`` and ``all_gather``
(megalith/jax/collectives.py) move JAX arrays between processes over megalith_comm.
The update runs on the engine's SIMD kernel over host buffers: see
megalith/jax/transform.py ([Note: what is copied]) for what crosses between JAX and the
engine, and for the update under ``jax.jit`` (an ordered ``io_callback``).

JAX and optax are optional: ``pip install jax optax`` (or ``pip install megalith[jax]``).
"""

from __future__ import annotations

try:
    import jax  # noqa: F401
    import optax  # noqa: F401
except ImportError as exc:  # pragma: no cover - exercised only without jax
    raise ImportError(
        f"megalith.jax needs JAX and optax ({exc}): pip install jax optax "
        "(or pip install 'megalith[jax]')"
    ) from exc

from . import collectives
from .collectives import all_gather, all_reduce, reduce_scatter
from .offload import offloaded_adamw
from .optimizers import adamw, lion, sgd
from .state import EngineState, load_state, save_state, state_dict
from .zero1 import Zero1State, zero1_adamw

__all__ = [
    "EngineState",
    "Zero1State",
    "adamw",
    "all_gather",
    "all_reduce",
    "collectives",
    "lion",
    "load_state",
    "offloaded_adamw",
    "reduce_scatter",
    "save_state",
    "sgd",
    "state_dict",
    "zero1_adamw",
]
