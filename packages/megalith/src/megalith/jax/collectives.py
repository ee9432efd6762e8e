"""Collectives on JAX arrays between processes: all_reduce, reduce_scatter, all_gather.

One process per rank, as ``jax.distributed`` lays processes out (process_index ==
rank, process_count == world size), or one single-process JAX per rank (CPU tests).
megalith_comm carries the data: call ``megalith_comm.init()`` on every rank first
(torchrun / SLURM / OpenMPI environment; under ``jax.distributed`` with the same rank
and world size). Every rank of the group calls the same collectives in the same order
with the same shapes and dtypes; a rank that does not fails every rank with a
``megalith_comm.CollectiveMismatchError`` naming the difference, never a hang.

Each array crosses to torch through DLPack without a copy: a CPU array becomes a CPU
tensor (Gloo), a CUDA array a CUDA tensor on its device (the engine's NCCL
communicator, on torch's current stream, which DLPack orders after JAX's work and
before JAX's next use). JAX arrays are immutable, so every result is a new array:
all_reduce copies its input once and reduces the copy; reduce_scatter and all_gather
read the input in place and write a fresh output, which JAX adopts without a copy.

These are eager calls on concrete arrays; inside ``jax.jit`` use ``jax.lax.psum``
and friends over a mesh, or call them outside the jitted function.
"""

from __future__ import annotations

from typing import Any

import jax
import torch

OPS = ("sum", "avg", "max", "min", "prod")
_MAX_DIMS = 8  # dimensions exchanged by all_gather(tiled=True) to agree on shapes


def group_for(name: str, group: Any) -> Any:
    """The megalith_comm group to run on, after checking the process layout."""
    import megalith_comm as comm
    from megalith_comm.group import resolve

    if not comm.is_initialized():
        raise RuntimeError(
            f"megalith.jax.{name}: megalith_comm is not initialized: call megalith_comm.init() "
            "on every rank first (it reads torchrun/SLURM/OpenMPI's RANK and WORLD_SIZE; under "
            "jax.distributed pass the same rank and world size: megalith_comm.init(rank=jax."
            "process_index(), world_size=jax.process_count(), master_addr=..., master_port=...))"
        )
    world = comm.get_world()
    count, index = jax.process_count(), jax.process_index()
    if count > 1 and (count != world.world_size or index != world.rank):
        raise RuntimeError(
            f"megalith.jax.{name}: jax.distributed has process {index} of {count} but "
            f"megalith_comm has rank {world.rank} of {world.world_size}: one process per rank "
            "is needed, so init megalith_comm with rank=jax.process_index() and "
            "world_size=jax.process_count()"
        )
    return resolve(group)


def _tensor(name: str, x: Any) -> torch.Tensor:
    """x as a torch tensor sharing its memory (DLPack)."""
    if isinstance(x, jax.core.Tracer):
        raise TypeError(
            f"megalith.jax.{name}: got a traced value (inside jax.jit, grad or vmap); these "
            "collectives run eagerly on concrete arrays: call them outside the jitted function, "
            "or use jax.lax.psum / psum_scatter / all_gather over a mesh inside it"
        )
    if not isinstance(x, jax.Array):
        raise TypeError(f"megalith.jax.{name}: expected a jax.Array, got {type(x).__name__}")
    if not x.is_fully_addressable or len(x.devices()) != 1:
        raise ValueError(
            f"megalith.jax.{name}: the array lives on {len(x.devices())} devices "
            f"({x.sharding}); pass this process's single-device array (one device per rank, "
            "e.g. x.addressable_data(0), or jax.device_put(x, jax.local_devices()[0]))"
        )
    platform = next(iter(x.devices())).platform
    if platform == "gpu" and not torch.cuda.is_available():
        raise RuntimeError(
            f"megalith.jax.{name}: a GPU array goes to the engine's NCCL communicator as a torch "
            "CUDA tensor, but this torch has no CUDA: install a CUDA build of torch, or move the "
            "array to the CPU (jax.device_put(x, jax.devices('cpu')[0]))"
        )
    if platform not in ("cpu", "gpu"):
        raise ValueError(
            f"megalith.jax.{name}: arrays on {platform} are not supported (CPU and CUDA only)"
        )
    return torch.from_dlpack(x)


def _array(t: torch.Tensor) -> jax.Array:
    return jax.dlpack.from_dlpack(t)


def _check_op(name: str, op: str) -> None:
    if op not in OPS:
        raise ValueError(f"megalith.jax.{name}: op={op!r}; expected one of {', '.join(OPS)}")


def all_reduce(x: jax.Array, op: str = "sum", group: Any = None) -> jax.Array:
    """The reduction of every rank's `x` (same shape and dtype on each), on every rank."""
    _check_op("all_reduce", op)
    g = group_for("all_reduce", group)
    import megalith_comm as comm

    out = _tensor("all_reduce", x).clone()  # JAX's buffer is immutable: reduce a copy
    comm.all_reduce(out, op=op, group=g)
    return _array(out)


def rows_per_rank(rows: int, size: int) -> list[int]:
    """How reduce_scatter splits `rows` over `size` ranks: as numpy.array_split does (the
    first rows % size ranks get one row more)."""
    base, extra = divmod(rows, size)
    return [base + (r < extra) for r in range(size)]


def reduce_scatter(x: jax.Array, op: str = "sum", group: Any = None) -> jax.Array:
    """The reduction of every rank's `x`, split along axis 0: rank r gets its block of rows.

    Rows that do not divide by the group size split as ``numpy.array_split`` does
    (:func:`rows_per_rank`): the first ``rows % size`` ranks get one row more.
    """
    _check_op("reduce_scatter", op)
    g = group_for("reduce_scatter", group)
    import megalith_comm as comm

    src = _tensor("reduce_scatter", x)
    if src.dim() == 0:
        raise ValueError(
            "megalith.jax.reduce_scatter: x is a scalar; it splits along axis 0, so give it "
            "at least one dimension (x.reshape(1) or all_reduce for a scalar)"
        )
    rows = rows_per_rank(src.shape[0], g.size)
    out = torch.empty((rows[g.rank], *src.shape[1:]), dtype=src.dtype, device=src.device)
    if len(set(rows)) == 1:
        comm.reduce_scatter(out, src, op=op, group=g)
    else:
        comm.reduce_scatter(out, list(torch.split(src, rows)), op=op, group=g)
    return _array(out)


def all_gather(x: jax.Array, group: Any = None, *, tiled: bool = False) -> jax.Array:
    """Every rank's `x`, in rank order, on every rank.

    tiled=False (``jax.lax.all_gather``'s default): stacked along a new axis 0, shape
    (size, *x.shape); every rank's x has the same shape. tiled=True: concatenated along
    axis 0; the ranks' row counts may differ (one small exchange of shapes first).
    """
    g = group_for("all_gather", group)
    import megalith_comm as comm

    src = _tensor("all_gather", x)
    if not tiled:
        out = torch.empty((g.size, *src.shape), dtype=src.dtype, device=src.device)
        comm.all_gather(out, src, group=g)
        return _array(out)
    if src.dim() == 0:
        raise ValueError(
            "megalith.jax.all_gather: tiled=True concatenates along axis 0, but x is a scalar: "
            "use tiled=False (stacks) or give x one dimension"
        )
    rows = _agree_on_rows(g, src)
    out = torch.empty((sum(rows), *src.shape[1:]), dtype=src.dtype, device=src.device)
    if len(set(rows)) == 1:
        comm.all_gather(out, src, group=g)
    else:
        comm.all_gather(list(torch.split(out, rows)), src, group=g)
    return _array(out)


def _agree_on_rows(g: Any, src: torch.Tensor) -> list[int]:
    """Every rank's row count, after checking that the rest of the shapes agree."""
    import megalith_comm as comm

    if src.dim() > _MAX_DIMS:
        raise ValueError(
            f"megalith.jax.all_gather: tiled=True takes up to {_MAX_DIMS} dimensions, x has "
            f"{src.dim()}: reshape it first"
        )
    mine = torch.full((_MAX_DIMS + 1,), -1, dtype=torch.int64)
    mine[0] = src.dim()
    mine[1 : 1 + src.dim()] = torch.tensor(src.shape, dtype=torch.int64)
    device = src.device if src.is_cuda else torch.device("cpu")
    shapes = torch.empty((g.size, _MAX_DIMS + 1), dtype=torch.int64, device=device)
    comm.all_gather(shapes, mine.to(device), group=g)
    table = shapes.cpu().tolist()
    dims = [row[1 : 1 + row[0]] for row in table]
    if any(d[1:] != dims[0][1:] or len(d) != len(dims[0]) for d in dims):
        listed = ", ".join(f"rank {g.ranks[i]}: {d}" for i, d in enumerate(dims))
        raise ValueError(
            f"megalith.jax.all_gather(tiled=True): the shapes after axis 0 differ between the "
            f"ranks ({listed}); every rank's x needs the same shape apart from its row count"
        )
    return [int(d[0]) for d in dims]
