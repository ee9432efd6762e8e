"""Running the launch `megalith run` planned: this node's agent, or one process per node.

[Note: one supervisor for the nodes] With --hostfile/--host every node, node 0
included, is a child `megalith run` (node 0 directly when it is this machine,
the others over ssh), so one loop here watches them all: when one exits with
an error, the others get NODE_GRACE_S to fail on their own (their ranks lose
a peer and stop within the collective timeout), then they are stopped. Each
node prints its failures on a marker line (report.encode) that this launcher
reads, so the summary names the first failing rank across all nodes.
"""

from __future__ import annotations

import secrets
import sys
import time

from megalith.launcher.hostfile import NodePlan
from megalith.launcher.local import run_local
from megalith.launcher.report import PREFIX, encode, exit_code, first_failure, summary
from megalith.launcher.ssh import NodeProcesses

NODE_GRACE_S = 15.0
POLL_S = 0.2


def _print(lines: list[str]) -> None:
    sys.stdout.flush()
    for line in lines:
        print(line, file=sys.stderr)
    sys.stderr.flush()


def run_here(argv: list[str], split: int, report: bool = False, token: str = "") -> int:
    """This node's ranks through the elastic agent; the summary if one failed. token: the
    job's store token handed over by the launcher of a multi-host run (guarded_store)."""
    outcome = run_local(argv, split, token=token)
    if outcome.failures:
        # Started by a launcher on node 0 (--report-failures): that one prints the summary.
        _print([encode(outcome.failures)] if report else summary(outcome.failures))
        return exit_code(first_failure(outcome.failures))
    if outcome.error:
        _print([f"{PREFIX} {outcome.error}"])
        return outcome.code
    return 0


def run_nodes(nodes: list[tuple[NodePlan, list[str]]]) -> int:
    """Starts one process per node, waits, stops the rest once one fails; the summary."""
    rank_of = {plan.host: plan.node_rank for plan, _ in nodes}
    # Every node's store forwarder signs with this job's token (launcher/guarded_store.py).
    token = secrets.token_hex(16)
    procs = NodeProcesses({plan.host: command for plan, command in nodes}, handover=token)
    stopped = False
    try:
        procs.start()
        while procs.running() and not procs.failed():
            time.sleep(POLL_S)
        unstarted = procs.unstarted()
        if unstarted:  # a node never ran (ssh failed): the others would only wait for it
            procs.stop()
            _print([f"{PREFIX} error: {line}" for line in unstarted])
            return 255
        if procs.failed() and not procs.wait(NODE_GRACE_S):
            procs.stop()
            stopped = True
        procs.wait()
    except KeyboardInterrupt:
        procs.stop()
        _print([f"{PREFIX} interrupted; stopped every node"])
        return 130
    failed = procs.failed()
    if not failed and not procs.failures:
        return 0
    lines = []
    for host, code in sorted(failed.items(), key=lambda item: rank_of[item[0]]):
        if any(f.host == host for f in procs.failures):
            continue  # its ranks are in the summary
        why = "stopped by the launcher" if stopped and code < 0 else procs.last_line.get(host, "")
        lines.append(
            f"{PREFIX} node {rank_of[host]} ({host}) exited with status {code}: "
            f"{why or 'no output'}"
        )
    if procs.failures:
        lines += summary(procs.failures)
        _print(lines)
        return exit_code(first_failure(procs.failures))
    _print(lines)
    code = next(iter(failed.values()), 1)
    return code if 0 < code < 256 else 1
