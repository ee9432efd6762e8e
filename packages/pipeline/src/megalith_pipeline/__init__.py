"""megalith_pipeline: pipeline parallelism (stage partitioning, schedules, micro-batching).

Nothing is implemented yet; see packages/pipeline/README.md for what is planned.
"""

__version__ = "0.1.0"
