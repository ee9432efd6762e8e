"""The exceptions megalith_comm raises.

`CommError` is a RuntimeError so code that catches torch.distributed's errors
(DistBackendError is a RuntimeError too) keeps working. Bad arguments are plain
ValueErrors raised before any communication.
"""

from __future__ import annotations


class CommError(RuntimeError):
    """A collective, the rendezvous or a peer failed.

    `ranks` names the global ranks found responsible (empty when unknown).
    `remote` is True when the failure was caused by another rank, so this
    rank's own excepthook does not report itself as the culprit.
    """

    def __init__(self, message: str, ranks: tuple[int, ...] = (), remote: bool = False):
        super().__init__(message)
        self.ranks = tuple(ranks)
        self.remote = remote


class CollectiveMismatchError(CommError):
    """Debug mode found ranks of one group calling different collectives."""
