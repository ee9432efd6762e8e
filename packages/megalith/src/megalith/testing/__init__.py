"""megalith.testing: helpers for distributed tests.

    from megalith.testing import run_distributed, run_grid

    def check(rank, n):
        t = torch.full((n,), float(rank))
        megalith_comm.all_reduce(t)
        return t.tolist()

    results = run_distributed(check, 3, 5)   # one list per rank

Ranks run on CPU with Gloo by default; backend="nccl" gives each rank a GPU and
skips the test when there are not enough; backend="auto" picks. See spawn.py.
"""

from .spawn import DistributedTestError, free_port, gpus_for, run_distributed, run_grid

__all__ = ["DistributedTestError", "free_port", "gpus_for", "run_distributed", "run_grid"]
