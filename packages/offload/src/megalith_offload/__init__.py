"""megalith_offload: where chunks and optimizer states live (GPU, pinned CPU memory, NVMe).

Nothing is implemented yet; see packages/offload/README.md for what is planned.
"""

__version__ = "0.1.0"
