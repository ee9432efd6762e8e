"""megalith_zero: ZeRO stage 1/2/3 sharding and mixed precision on the megalith engine.

Nothing is implemented yet; see packages/zero/README.md for what is planned.
"""

__version__ = "0.1.0"
