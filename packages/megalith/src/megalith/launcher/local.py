"""This node's ranks, started and watched by torch.distributed.run's elastic agent.

The launcher hands the agent a torchrun command line (torch.distributed.run.run)
and adds what its failure summary and the ranks' safety need:
- each rank's stdout and stderr are teed into a log directory (a temporary one
  unless --log_dir is given; kept when a rank fails so the summary can point at
  it) and reach the console as whole lines prefixed with the global rank
  (rank_output);
- each rank starts through rank_entry.py, which ties it to this process with a
  parent-death signal (rank_command);
- a rank that is stopped (SIGSTOP) when the job is stopped is killed at once and
  reported as hung (stopped_ranks).
Restarts, signal forwarding and tearing the group down when one rank dies are the
agent's.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from megalith.launcher import guarded_store, rank_output
from megalith.launcher.rank_command import through_rank_entry
from megalith.launcher.report import Failure, from_child_failed, signal_name
from megalith.launcher.stopped_ranks import StoppedRankReaper
from megalith.launcher.torchrun_argv import option_value


@dataclass
class Outcome:
    failures: list[Failure] = field(default_factory=list)
    error: str = ""  # the agent itself stopped (rendezvous failed, signal, ...)
    code: int = 0  # exit status when error is set

    @property
    def ok(self) -> bool:
        return not self.failures and not self.error


def with_log_options(argv: list[str], split: int) -> tuple[list[str], Path, bool]:
    """argv with --log_dir and --tee added where the user gave none; (argv, log_dir, temp)."""
    head, tail = argv[:split], argv[split:]
    user_dir = option_value(head, "--log_dir", "--log-dir")
    log_dir = Path(user_dir) if user_dir else Path(tempfile.mkdtemp(prefix="megalith_run_"))
    if not user_dir:
        head += ["--log_dir", str(log_dir)]
    if option_value(head, "--tee", "-t", "--redirects", "-r") is None:
        head += ["--tee", "3"]  # both streams to the console and to <log_dir>/.../*.log
    return head + tail, log_dir, not user_dir


def run_local(argv: list[str], split: int, host: str = "", token: str = "") -> Outcome:
    """Runs torchrun's argv (argv[:split] its options, the rest the script and its args);
    token: the job's store token (default: node 0's, or a new one; see guarded_store)."""
    import torch.distributed.run as torchrun
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    argv, split, _ = guarded_store.guarded_argv(argv, split, token or guarded_store.job_token())
    guarded_store.register()
    argv, split = through_rank_entry(argv, split)
    argv, log_dir, temporary = with_log_options(argv, split)
    log_dir.mkdir(parents=True, exist_ok=True)
    before = set(log_dir.iterdir())
    rank_output.install()
    outcome = Outcome()
    reaper = StoppedRankReaper()
    try:
        with reaper:
            torchrun.run(torchrun.parse_args(argv))
    except ChildFailedError as exc:
        new = sorted((d for d in log_dir.iterdir() if d not in before), key=os.path.getmtime)
        outcome.failures = from_child_failed(exc, new[-1] if new else None, host, reaper.killed)
    except SignalException as exc:
        outcome.error = f"stopped by {signal_name(int(exc.sigval))}"
        outcome.code = 128 + int(exc.sigval)
    except Exception as exc:  # rendezvous or agent failure: no rank to blame
        outcome.error = f"the elastic agent failed: {type(exc).__name__}: {exc}"
        outcome.code = 1
    finally:
        guarded_store.close_forwarders()
    if temporary and not outcome.failures:
        shutil.rmtree(log_dir, ignore_errors=True)
    return outcome
