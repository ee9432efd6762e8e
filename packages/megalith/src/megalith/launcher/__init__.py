"""The pieces of `megalith run` (megalith/cli/run.py).

- hostfile: hosts and their slots, from a hostfile or --host, filtered by
  --include / --exclude, and the per-node plan (nproc, visible devices).
- local: this node's ranks, through torch.distributed.run's elastic agent.
- ssh: the command that starts each other node, and the ssh processes.
- report: which rank failed first, and the summary the launcher ends with.

Nothing here imports torch at module level: the CLI builds its parser from these
modules on every `megalith` call.
"""
