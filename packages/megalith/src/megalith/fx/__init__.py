"""ColossalAI's colossalai.fx checks that scripts and tests call before tracing or lazy
initialisation: is_compatible_with_meta() and the compatibility decorator."""

from ._compatibility import compatibility, is_compatible_with_meta

__all__ = ["compatibility", "is_compatible_with_meta"]
