"""ColossalAI's entry points: launch, launch_from_torch/slurm/openmpi, get_default_parser.

    megalith.launch(rank=r, world_size=n, host="127.0.0.1", port=29500)
    megalith.launch_from_torch()                        # under torchrun / `megalith run`
    megalith.launch_from_slurm(host=args.host, port=args.port)      # under srun
    megalith.launch_from_openmpi(host=args.host, port=args.port)    # under mpirun

Each one joins megalith's process group (megalith_comm.init: Gloo for CPU tensors,
the engine's NCCL for CUDA tensors, whatever `backend` says), then seeds python's
`random`, numpy and torch with `seed` (the same seed on every rank, as ColossalAI
does) and, with verbose, logs one line on rank 0. Rank, world size and port are
checked before any socket is opened; an error names the value and where it came from.
"""

from __future__ import annotations

import argparse
import os
import warnings

__all__ = [
    "get_default_parser",
    "launch",
    "launch_from_openmpi",
    "launch_from_slurm",
    "launch_from_torch",
]

# Backends megalith runs whatever it is asked: Gloo for CPU tensors, NCCL for CUDA ones.
_KNOWN_BACKENDS = ("nccl", "gloo", "cpu:gloo,cuda:nccl")
_warned: set[str] = set()


def _warn_once(key: str, message: str) -> None:
    if key not in _warned:
        _warned.add(key)
        warnings.warn(message, stacklevel=3)


def get_default_parser() -> argparse.ArgumentParser:
    """An argparse parser with ColossalAI's launch options (--config, --host, --port,
    --world_size, --rank, --local_rank, --backend, default "nccl"); add your own to it."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--config", type=str, help="path to a config file (read by your script)")
    parser.add_argument("--host", type=str, help="the master address for distributed training")
    parser.add_argument("--port", type=int, help="the master port for distributed training")
    parser.add_argument("--world_size", type=int, help="world size for distributed training")
    parser.add_argument("--rank", type=int, help="rank for the default process group")
    parser.add_argument("--local_rank", type=int, help="local rank on the node")
    parser.add_argument(
        "--backend", type=str, default="nccl", help="backend for distributed communication"
    )
    return parser


def _check_backend(backend: str) -> None:
    import torch

    if backend == "nccl" and not torch.cuda.is_available():
        _warn_once(
            "nccl-cpu",
            "megalith.launch(backend='nccl'): no CUDA GPU is visible, so the ranks run on CPU "
            "and communicate through Gloo (pass backend='gloo' to silence this)",
        )
    elif backend not in _KNOWN_BACKENDS:
        _warn_once(
            f"backend-{backend}",
            f"megalith.launch(backend={backend!r}) is ignored: megalith always sends CPU "
            "tensors through Gloo and CUDA tensors through NCCL; results are the same",
        )


def _int_arg(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        try:
            return int(str(value).strip())
        except ValueError:
            raise ValueError(
                f"megalith.launch: {name}={value!r} is not an integer; pass {name} as an int "
                "(with get_default_parser, give --" + name + " on the command line)"
            ) from None
    return value


def _default_local_rank(rank: int) -> int:
    """LOCAL_RANK when the launcher set it, else rank modulo the GPUs (ColossalAI's rule);
    on CPU ranks, the rank itself (one node)."""
    raw = os.environ.get("LOCAL_RANK")
    if raw is not None and raw.strip().isdigit():
        return int(raw)
    import torch

    if torch.cuda.is_available() and torch.cuda.device_count() > 0:
        return rank % torch.cuda.device_count()
    return rank


def launch(
    rank: int,
    world_size: int,
    host: str,
    port: int,
    backend: str = "nccl",
    local_rank: int | None = None,
    seed: int = 1024,
    verbose: bool = True,
) -> None:
    """Joins the job as `rank` of `world_size`, with rank 0's store at host:port.

    backend: "nccl" (the default) runs CUDA tensors through NCCL; on a machine without
    CUDA the ranks run on CPU through Gloo, with a one-time warning. local_rank picks the
    GPU (None: LOCAL_RANK, else rank % GPU count). A second call with the same values
    does nothing; with other values it fails, naming megalith_comm.destroy().
    """
    from megalith_comm import LaunchConfig

    for name, value in (("host", host), ("port", port)):
        if value is None:
            raise ValueError(
                f"megalith.launch: {name} is None; pass the master's {name} (rank 0's machine) "
                f"to every rank, e.g. --{name} on the command line of get_default_parser()"
            )
    rank = _int_arg("rank", rank)
    world_size = _int_arg("world_size", world_size)
    port = _int_arg("port", port)
    local_rank = (
        _default_local_rank(rank) if local_rank is None else _int_arg("local_rank", local_rank)
    )
    host = str(host).strip("[]")  # ColossalAI accepts IPv6 as "[::1]" too
    # Checked here, on every rank, before any socket is opened.
    LaunchConfig(rank, world_size, local_rank, host, port)
    _check_backend(backend)
    # The store's address also goes to the environment: megalith_comm reads the
    # launcher's variables there (OpenMPI's without MASTER_ADDR would be refused).
    os.environ["MASTER_ADDR"] = host
    os.environ["MASTER_PORT"] = str(port)
    import megalith_comm as comm

    world = comm.init(
        rank=rank, world_size=world_size, master_addr=host, master_port=port, local_rank=local_rank
    )
    from .utils import set_seed

    set_seed(seed)
    if verbose:
        from .logging import get_dist_logger

        get_dist_logger().info(
            f"Distributed environment is initialized, world size: {world.world_size}", ranks=[0]
        )


def _env_int(env_name: str, launcher: str) -> int:
    raw = os.environ.get(env_name)
    if raw is None:
        raise RuntimeError(
            f"Could not find {env_name} in the environment: launch_from_{launcher} reads the "
            f"rank and world size that {launcher} sets; start the script with "
            + {"slurm": "srun", "openmpi": "mpirun", "torch": "torchrun or `megalith run`"}[
                launcher
            ]
            + ", or call megalith.launch(rank=..., world_size=..., host=..., port=...)"
        )
    try:
        return int(raw.strip())
    except ValueError:
        raise ValueError(f"{env_name}={raw!r} is not an integer") from None


def launch_from_slurm(
    host: str, port: int, backend: str = "nccl", seed: int = 1024, verbose: bool = True
) -> None:
    """launch() with the rank, world size and local rank srun sets (SLURM_PROCID,
    SLURM_NPROCS or SLURM_NTASKS, SLURM_LOCALID)."""
    rank = _env_int("SLURM_PROCID", "slurm")
    size_var = "SLURM_NPROCS" if "SLURM_NPROCS" in os.environ else "SLURM_NTASKS"
    if size_var not in os.environ:
        size_var = "SLURM_NPROCS"  # the name in the error, as ColossalAI documents it
    world_size = _env_int(size_var, "slurm")
    local = os.environ.get("SLURM_LOCALID")
    local_rank = _env_int("SLURM_LOCALID", "slurm") if local is not None else None
    launch(rank, world_size, host, port, backend, local_rank, seed, verbose)


def launch_from_openmpi(
    host: str, port: int, backend: str = "nccl", seed: int = 1024, verbose: bool = True
) -> None:
    """launch() with the rank, world size and local rank mpirun sets
    (OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE, OMPI_COMM_WORLD_LOCAL_RANK)."""
    rank = _env_int("OMPI_COMM_WORLD_RANK", "openmpi")
    local_rank = _env_int("OMPI_COMM_WORLD_LOCAL_RANK", "openmpi")
    world_size = _env_int("OMPI_COMM_WORLD_SIZE", "openmpi")
    launch(rank, world_size, host, port, backend, local_rank, seed, verbose)


def launch_from_torch(backend: str = "nccl", seed: int = 1024, verbose: bool = True) -> None:
    """launch() from torchrun's (or `megalith run`'s) RANK, WORLD_SIZE, LOCAL_RANK,
    MASTER_ADDR and MASTER_PORT. With none of them set it is one process (world size 1),
    so a script also runs with plain `python`."""
    if "RANK" not in os.environ and "WORLD_SIZE" not in os.environ:
        # No launcher: a job of one process.
        port = _env_int("MASTER_PORT", "torch") if "MASTER_PORT" in os.environ else 0
        host = os.environ.get("MASTER_ADDR", "127.0.0.1")
        launch(0, 1, host, port, backend, 0, seed, verbose)
        return
    rank = _env_int("RANK", "torch")
    world_size = _env_int("WORLD_SIZE", "torch")
    local_rank = _env_int("LOCAL_RANK", "torch") if "LOCAL_RANK" in os.environ else None
    host = os.environ.get("MASTER_ADDR")
    if host is None and world_size == 1:
        host = "127.0.0.1"
    if host is None:
        raise RuntimeError(
            "Could not find MASTER_ADDR in the environment: RANK and WORLD_SIZE are set but "
            "not the master's address; start the script with torchrun or `megalith run`, "
            "which set it"
        )
    from megalith_comm.launch_env import DEFAULT_PORT

    port = _env_int("MASTER_PORT", "torch") if "MASTER_PORT" in os.environ else DEFAULT_PORT
    launch(rank, world_size, host, port, backend, local_rank, seed, verbose)
