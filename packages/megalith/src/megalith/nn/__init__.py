"""ColossalAI's colossalai.nn: its optimizers and learning-rate schedulers
(`megalith.nn.optimizer`, `megalith.nn.lr_scheduler`), also importable from here."""

from .lr_scheduler import *  # noqa: F403
from .lr_scheduler import __all__ as _schedulers
from .optimizer import *  # noqa: F403
from .optimizer import __all__ as _optimizers

__all__ = [*_schedulers, *_optimizers]
