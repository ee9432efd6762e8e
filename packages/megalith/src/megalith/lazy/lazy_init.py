"""ColossalAI's module path colossalai.lazy.lazy_init: LazyInitContext lives in context.py."""

from .context import LazyInitContext, LazyTensor, is_lazy

__all__ = ["LazyInitContext", "LazyTensor", "is_lazy"]
