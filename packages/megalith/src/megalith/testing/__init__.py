"""megalith.testing: helpers for distributed tests, megalith's and ColossalAI's.

    from megalith.testing import run_distributed, run_grid

    def check(rank, n):
        t = torch.full((n,), float(rank))
        megalith_comm.all_reduce(t)
        return t.tolist()

    results = run_distributed(check, 3, 5)   # one list per rank

Ranks run on CPU with Gloo by default; backend="nccl" gives each rank a GPU and
skips the test when there are not enough; backend="auto" picks. See spawn.py.

ColossalAI's colossalai.testing is here under the same names: spawn (ranks that call
megalith.launch themselves, spawn_ranks.py), parameterize, rerun_if_address_is_in_use,
clear_cache_before_run, ... (utils.py), assert_close, check_state_dict_equal, ...
(comparison.py), run_on_environment_flag (pytest_wrapper.py) and seed_all (random.py).
"""

from .comparison import (
    assert_close,
    assert_close_loose,
    assert_equal,
    assert_equal_in_group,
    assert_hf_output_close,
    assert_not_equal,
    check_state_dict_equal,
)
from .pytest_wrapper import run_on_environment_flag
from .random import seed_all
from .spawn import DistributedTestError, free_port, gpus_for, run_distributed, run_grid
from .utils import (
    DummyDataloader,
    clear_cache_before_run,
    parameterize,
    rerun_if_address_is_in_use,
    rerun_on_exception,
    skip_if_not_enough_gpus,
    spawn,
)

__all__ = [
    "DistributedTestError",
    "DummyDataloader",
    "assert_close",
    "assert_close_loose",
    "assert_equal",
    "assert_equal_in_group",
    "assert_hf_output_close",
    "assert_not_equal",
    "check_state_dict_equal",
    "clear_cache_before_run",
    "free_port",
    "gpus_for",
    "parameterize",
    "rerun_if_address_is_in_use",
    "rerun_on_exception",
    "run_distributed",
    "run_grid",
    "run_on_environment_flag",
    "seed_all",
    "skip_if_not_enough_gpus",
    "spawn",
]
