"""`megalith run`: start a distributed job, torchrun's way or ColossalAI's.

    megalith run --nproc_per_node 4 train.py --lr 1e-3        # this machine
    megalith run --hostfile hosts --nproc_per_node 8 train.py  # "host slots=N" lines
    megalith run --host a,b --master_addr a -m my.module        # one node per host

On one node the ranks are torch.distributed.run's (the elastic agent starts,
watches and stops them; torchrun's options mean what they mean there). With
--hostfile or --host each host is one node: node 0 is the first host (started
directly when it is this machine), the others are started over ssh, each
running `megalith run` with --nnodes, --node_rank, --master_addr and
--master_port filled in. When a rank fails, the launcher's last lines name the
rank that failed first, its exit code and its error.
"""

from __future__ import annotations

import argparse
import os
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path

from megalith.launcher.hostfile import (
    LaunchError,
    NodePlan,
    check_nproc,
    filter_hosts,
    parse_host_list,
    parse_hostfile,
    plan_nodes,
)
from megalith.launcher.report import PREFIX
from megalith.launcher.ssh import (
    is_local,
    is_loopback,
    pin_gloo_interface,
    remote_command,
    ssh_command,
    stop_with_launcher,
    travelling_env,
)

DEFAULT_MASTER_PORT = 29500

# torchrun's options, passed on to torch.distributed.run under their first name.
_FLAG = {"action": "store_true", "default": None}
TORCHRUN_OPTIONS: tuple[tuple[tuple[str, ...], dict], ...] = (
    (("--nproc_per_node", "--nproc-per-node"), {"help": "processes per node: N, auto, cpu, gpu"}),
    (("--nnodes",), {"help": "number of nodes (MIN:MAX with an elastic rendezvous)"}),
    (("--node_rank", "--node-rank"), {"type": int, "help": "this node's rank"}),
    (("--master_addr", "--master-addr"), {"help": "address of node 0"}),
    (("--master_port", "--master-port"), {"type": int, "help": "port on node 0"}),
    (("--rdzv_backend", "--rdzv-backend"), {"help": "rendezvous backend (static, c10d, ...)"}),
    (("--rdzv_endpoint", "--rdzv-endpoint"), {"help": "rendezvous endpoint HOST:PORT"}),
    (("--rdzv_id", "--rdzv-id"), {"help": "rendezvous (job) id"}),
    (("--rdzv_conf", "--rdzv-conf"), {"help": "rendezvous settings k1=v1,k2=v2"}),
    (("--standalone",), {**_FLAG, "help": "single node, rendezvous on a free local port"}),
    (("--max_restarts", "--max-restarts"), {"type": int, "help": "restarts of the group"}),
    (("--monitor_interval", "--monitor-interval"), {"type": float, "help": "seconds"}),
    (("--start_method", "--start-method"), {"choices": ["spawn", "fork", "forkserver"]}),
    (("--role",), {"help": "name of the worker role"}),
    (("--local_addr", "--local-addr"), {"help": "address of this node"}),
    (("--module", "-m"), {**_FLAG, "help": "run SCRIPT as a module, like python -m"}),
    (("--no_python", "--no-python"), {**_FLAG, "help": "SCRIPT is a program, not Python"}),
    (("--run_path", "--run-path"), {**_FLAG, "help": "run SCRIPT with runpy in the worker"}),
    (("--log_dir", "--log-dir"), {"help": "where the ranks' logs go (default: a temp dir)"}),
    (("--redirects", "-r"), {"help": "std streams to redirect to log files (torchrun's -r)"}),
    (("--tee", "-t"), {"help": "std streams to tee to log files (default 2: stderr)"}),
    (("--local_ranks_filter", "--local-ranks-filter"), {"help": "local ranks shown on console"}),
)
# Set per node by the launcher when it starts the nodes itself.
NODE_OPTIONS = ("nproc_per_node", "nnodes", "node_rank", "master_addr", "master_port")


@dataclass
class NodeLaunch:
    plan: NodePlan
    run_args: list[str]  # `megalith run` / torchrun argv of this node: options, script, args
    split: int  # run_args[split:] is the script and its args
    command: list[str] | None  # how the launcher starts it; None: the agent runs in-process


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "run",
        help="launch a distributed job (torchrun / colossalai run compatible)",
        description=__doc__.split("\n\n")[0],
    )
    torchrun = parser.add_argument_group("torchrun options")
    for names, kwargs in TORCHRUN_OPTIONS:
        torchrun.add_argument(*names, **kwargs)
    hosts = parser.add_argument_group("multi-host options (ColossalAI)")
    hosts.add_argument("--hostfile", help="file of 'HOST slots=N' lines, one node per host")
    hosts.add_argument("-H", "--host", help="comma-separated hosts, one node each")
    hosts.add_argument("--include", help="hosts to use: 'h1,h2' or 'h1:0,1@h2' (with slots)")
    hosts.add_argument("--exclude", help="hosts or slots to leave out, same forms as --include")
    hosts.add_argument("--num_nodes", "--num-nodes", type=int, help="use the first N hosts")
    hosts.add_argument("--ssh", help="ssh command (default: $MEGALITH_SSH or ssh)")
    hosts.add_argument("--ssh_port", "--ssh-port", type=int, help="port for ssh")
    hosts.add_argument(
        "--env",
        action="append",
        default=[],
        help="NAME or NAME=VALUE (comma-separated, repeatable) to set on every host; "
        "MEGALITH_*, NCCL_*, CUDA_*, PYTHON*, OMP_*, MKL_* and PATH always travel",
    )
    parser.add_argument("--report-failures", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument(
        "script", help="training script (or module with -m, program with --no_python)"
    )
    parser.add_argument("script_args", nargs=argparse.REMAINDER, help="its arguments")
    parser.set_defaults(func=run)
    return parser


def forward(args: argparse.Namespace, skip: tuple[str, ...] = ()) -> list[str]:
    """The torchrun options the user gave, as a torchrun argv."""
    argv: list[str] = []
    for names, kwargs in TORCHRUN_OPTIONS:
        dest = names[0][2:]
        value = getattr(args, dest)
        if dest in skip or value is None:
            continue
        argv += [names[0]] if kwargs.get("action") == "store_true" else [names[0], str(value)]
    return argv


def _check_common(args: argparse.Namespace, cwd: str) -> None:
    check_nproc(args.nproc_per_node)
    if args.module and args.no_python:
        raise LaunchError("-m/--module and --no_python exclude each other: pass one")
    if args.max_restarts is not None and args.max_restarts < 0:
        raise LaunchError(f"--max_restarts {args.max_restarts}: give 0 or more")
    plain_script = not (args.module or args.no_python)
    if plain_script and not Path(cwd, args.script).is_file():
        raise LaunchError(
            f"script {args.script} not found (in {cwd}); for a module pass -m, "
            "for a program that is not Python pass --no_python"
        )


def plan_launch(args: argparse.Namespace, environ=None, cwd: str | None = None, local=is_local):
    """Every node's launch, validated before anything starts (raises LaunchError)."""
    environ = os.environ if environ is None else environ
    cwd = cwd or os.getcwd()
    _check_common(args, cwd)
    if args.host and args.hostfile:
        raise LaunchError("--host and --hostfile exclude each other: list the hosts in one")
    if not (args.host or args.hostfile):
        for given, name in ((args.include, "--include"), (args.exclude, "--exclude")):
            if given:
                raise LaunchError(f"{name} selects from --hostfile or --host: pass one of them")
        if args.num_nodes is not None:
            raise LaunchError("--num_nodes selects from --hostfile or --host: pass one of them")
        argv = forward(args)
        plan = NodePlan("", 0, args.nproc_per_node or "1")
        return [NodeLaunch(plan, [*argv, args.script, *args.script_args], len(argv), None)]

    hosts = parse_hostfile(args.hostfile) if args.hostfile else parse_host_list(args.host)
    hosts = filter_hosts(hosts, args.include, args.exclude)
    for dest in ("node_rank", "standalone"):
        if getattr(args, dest) is not None:
            raise LaunchError(f"--{dest} is set per host by the launcher: drop it")
    num_nodes = args.num_nodes
    if args.nnodes is not None:
        if not args.nnodes.isdigit() or (num_nodes is not None and int(args.nnodes) != num_nodes):
            raise LaunchError(
                f"--nnodes {args.nnodes} with --hostfile/--host is the number of hosts to use: "
                "give one number (and the same as --num_nodes)"
            )
        num_nodes = int(args.nnodes)
    plans = plan_nodes(hosts, args.nproc_per_node, num_nodes)
    addr = args.master_addr or plans[0].host
    if is_loopback(addr) and not all(is_loopback(p.host) for p in plans):
        raise LaunchError(
            f"master address {addr} is a loopback address the other hosts cannot reach: pass "
            f"--master_addr with an address of {plans[0].host} that they can reach"
        )
    port = args.master_port or DEFAULT_MASTER_PORT
    common = forward(args, NODE_OPTIONS)
    if (args.rdzv_backend or "static") != "static":
        if args.rdzv_endpoint is None:
            common += ["--rdzv_endpoint", f"{addr}:{port}"]
        if args.rdzv_id is None:
            common += ["--rdzv_id", uuid.uuid4().hex]
    env = travelling_env(environ, args.env)
    launches = []
    for plan in plans:
        options = ["--nproc_per_node", plan.nproc, "--nnodes", str(len(plans))]
        options += ["--node_rank", str(plan.node_rank), "--master_addr", addr]
        options += ["--master_port", str(port), *common, "--report-failures"]
        run_args = [*options, args.script, *args.script_args]
        line = remote_command(plan, run_args, env, cwd)
        if plan.node_rank == 0 and local(plan.host):
            command = ["/bin/sh", "-c", line]
        else:
            command = ssh_command(plan.host, line, args.ssh, args.ssh_port)
        launches.append(NodeLaunch(plan, run_args, len(options), command))
    return launches


def run(args: argparse.Namespace) -> int:
    try:
        launches = plan_launch(args)
    except LaunchError as exc:
        print(f"{PREFIX} error: {exc}", file=sys.stderr)
        return 2
    from megalith.launcher.nodes import run_here, run_nodes

    if len(launches) == 1 and launches[0].command is None:
        pin_gloo_interface(args.master_addr)  # [Note: Gloo's address] in launcher/ssh.py
        token = ""
        if args.report_failures:  # a node of a multi-host launch: [Note: the lifeline]
            token = stop_with_launcher(handover=True)  # the store's token (guarded_store)
        return run_here(launches[0].run_args, launches[0].split, args.report_failures, token)
    return run_nodes([(launch.plan, launch.command) for launch in launches])
