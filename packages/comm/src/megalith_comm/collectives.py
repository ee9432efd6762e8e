"""Collectives on torch tensors: one API, CPU tensors through Gloo, CUDA tensors through NCCL.

Conventions (as in torch.distributed): `group=None` is the whole world; `src`/`dst`
are global ranks; `async_op=True` returns a Handle whose `wait()` completes the
operation, otherwise the call returns when the result is in place (on CUDA: ordered
on the current stream). Ops: "sum", "avg", "min", "max", "prod". A group of one rank
is the identity and never communicates.

Sizes are checked before anything is sent, and errors give the numbers. The flat
forms of reduce_scatter / all_gather need the input (output) to hold exactly one
equal shard per rank; shards of different sizes go through the list forms, which pad
to the largest shard, and uneven all_to_all takes split sizes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from . import debug
from .backends import OPS, ops_for
from .group import ProcessGroup, resolve
from .handle import Handle, finish, launch

Then = list[Callable[[], None]]


def _check_tensor(op: str, name: str, t: object) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{op}: {name} must be a torch.Tensor, got {type(t).__name__}")
    return t


def _check_op(name: str, op: str, dtype: torch.dtype) -> None:
    if op not in OPS:
        raise ValueError(f"{name}: op={op!r}; expected one of {', '.join(OPS)}")
    if dtype == torch.bool and op in ("avg", "prod"):
        raise ValueError(f"{name}: op {op!r} is not defined for bool tensors")


def _check_like(op: str, ref: torch.Tensor, others: Sequence[torch.Tensor], names: str) -> None:
    for t in others:
        _check_tensor(op, names, t)
        if t.dtype != ref.dtype:
            raise ValueError(f"{op}: {names} has dtype {t.dtype} but the other side {ref.dtype}")
        if t.device != ref.device:
            raise ValueError(f"{op}: {names} is on {t.device} but the other side on {ref.device}")


def _staged(t: torch.Tensor, then: Then) -> torch.Tensor:
    """A contiguous flat view of t; if t is not contiguous, a copy written back on completion."""
    if t.is_contiguous():
        return t.view(-1)
    tmp = t.contiguous()
    then.append(lambda: t.copy_(tmp))
    return tmp.view(-1)


def _divide(flat: torch.Tensor, n: int) -> None:
    """avg = sum / n: true division for floats, truncating for integers (as NCCL's ncclAvg)."""
    if flat.is_floating_point() or flat.is_complex():
        flat.div_(n)
    else:
        flat.copy_(torch.div(flat, n, rounding_mode="trunc"))


def _what(op: str, g: ProcessGroup, t: torch.Tensor) -> str:
    return f"{op}(shape {list(t.shape)}, {str(t.dtype).replace('torch.', '')}) on group {g.name!r}"


def _reduce_then(op: str, ops_avg: bool, flat: torch.Tensor, n: int, then: Then) -> str:
    """The op to hand the backend; for "avg" without native support, sum and divide after."""
    if op == "avg" and not ops_avg:
        then.insert(0, lambda: _divide(flat, n))
        return "sum"
    return op


def all_reduce(
    tensor: torch.Tensor, op: str = "sum", group: ProcessGroup | None = None, async_op: bool = False
) -> Handle | None:
    """Reduces `tensor` across the group in place."""
    g = resolve(group)
    _check_tensor("all_reduce", "tensor", tensor)
    _check_op("all_reduce", op, tensor.dtype)
    debug.check(
        g, "all_reduce", dtype=tensor.dtype, device=tensor.device.type, redop=op, shape=tensor.shape
    )
    if g.size == 1:
        return finish(Handle.local(g, tensor.device), async_op)
    ops = ops_for(g, tensor.device)
    then: Then = []
    flat = _staged(tensor, then)
    native = _reduce_then(op, ops.native_avg, flat, g.size, then)
    what = _what("all_reduce", g, tensor)
    work = launch(g, what, lambda: ops.all_reduce(flat, native))
    return finish(Handle(g, what, [work], then), async_op)


def _check_per_rank_list(
    op: str,
    g: ProcessGroup,
    parts: Sequence[torch.Tensor],
    parts_name: str,
    part_word: str,
    mine: torch.Tensor,
    mine_name: str,
) -> list[int]:
    """The list form of reduce_scatter/all_gather: one tensor per rank, like
    `mine` in dtype and device, and this rank's entry the size of `mine`."""
    if len(parts) != g.size:
        each = "one shard per rank" if part_word == "shard" else "one per rank"
        raise ValueError(
            f"{op}: {parts_name} is a list of {len(parts)} tensors but group {g.name!r} "
            f"has {g.size} ranks ({each})"
        )
    _check_like(op, mine, parts, f"an {parts_name} {part_word}")
    sizes = [x.numel() for x in parts]
    n = mine.numel()
    if sizes[g.rank] != n:
        raise ValueError(
            f"{op}: this rank's {part_word} ({parts_name}[{g.rank}]) has {sizes[g.rank]} elements "
            f"but {mine_name} has {n}"
        )
    return sizes


def reduce_scatter(
    output: torch.Tensor,
    input: torch.Tensor | Sequence[torch.Tensor],
    op: str = "sum",
    group: ProcessGroup | None = None,
    async_op: bool = False,
) -> Handle | None:
    """Reduces across the group and leaves shard `group.rank` in `output`.

    input: a tensor of exactly group.size * output.numel() elements (shard i at
    [i * n, (i + 1) * n)), or a list of group.size tensors whose i-th is shard i
    (shards may differ in size; this rank's must match output).
    """
    g = resolve(group)
    _check_tensor("reduce_scatter", "output", output)
    _check_op("reduce_scatter", op, output.dtype)
    n = output.numel()
    if isinstance(input, (list, tuple)):
        sizes = _check_per_rank_list("reduce_scatter", g, input, "input", "shard", output, "output")
        pieces = list(input)
    else:
        _check_like("reduce_scatter", output, [input], "input")
        if input.numel() != n * g.size:
            raise ValueError(
                f"reduce_scatter: input has {input.numel()} elements but output ({n}) * group "
                f"size ({g.size}) = {n * g.size}: the flat form needs one equal shard per rank. "
                f"For shards of different sizes pass input as a list of {g.size} tensors."
            )
        sizes, pieces = None, None
    debug.check(
        g,
        "reduce_scatter",
        dtype=output.dtype,
        device=output.device.type,
        redop=op,
        shape=None if sizes else input.shape,
        numel=-1 if sizes else n,
        sizes=sizes,
    )
    if g.size == 1:
        output.copy_((pieces[0] if pieces else input).reshape(output.shape))
        return finish(Handle.local(g, output.device), async_op)
    ops = ops_for(g, output.device)
    then: Then = []
    if pieces is None:
        send = input.reshape(-1) if input.is_contiguous() else input.contiguous().view(-1)
        recv = _staged(output, then)
    else:  # pad every shard to the largest; the padding is reduced and thrown away
        m = max(sizes)
        send = torch.zeros(m * g.size, dtype=output.dtype, device=output.device)
        for i, x in enumerate(pieces):
            send[i * m : i * m + sizes[i]].copy_(x.reshape(-1))
        recv = torch.empty(m, dtype=output.dtype, device=output.device)
        then.append(lambda: output.copy_(recv[:n].view(output.shape)))
    native = _reduce_then(op, ops.native_avg, recv, g.size, then)
    what = _what("reduce_scatter", g, output)
    work = launch(g, what, lambda: ops.reduce_scatter(recv, send, native))
    return finish(Handle(g, what, [work], then), async_op)


def all_gather(
    output: torch.Tensor | Sequence[torch.Tensor],
    input: torch.Tensor,
    group: ProcessGroup | None = None,
    async_op: bool = False,
) -> Handle | None:
    """Gathers every rank's `input` into `output`.

    output: a tensor of exactly group.size * input.numel() elements (rank i's input at
    [i * n, (i + 1) * n)), or a list of group.size tensors, the i-th receiving rank i's
    input (sizes may differ per rank; this rank's must match input).
    """
    g = resolve(group)
    _check_tensor("all_gather", "input", input)
    n = input.numel()
    if isinstance(output, (list, tuple)):
        sizes = _check_per_rank_list("all_gather", g, output, "output", "piece", input, "input")
    else:
        _check_like("all_gather", input, [output], "output")
        if output.numel() != n * g.size:
            raise ValueError(
                f"all_gather: output has {output.numel()} elements but input ({n}) * group "
                f"size ({g.size}) = {n * g.size}: the flat form needs equal pieces per rank. "
                f"For pieces of different sizes pass output as a list of {g.size} tensors."
            )
        sizes = None
    debug.check(
        g,
        "all_gather",
        dtype=input.dtype,
        device=input.device.type,
        shape=None if sizes else input.shape,
        sizes=sizes,
    )
    if g.size == 1:
        target = output[0] if sizes else output
        target.copy_(input.reshape(target.shape))
        return finish(Handle.local(g, input.device), async_op)
    ops = ops_for(g, input.device)
    then: Then = []
    if sizes is None:
        send = input.reshape(-1) if input.is_contiguous() else input.contiguous().view(-1)
        recv = _staged(output, then)
    else:
        m = max(sizes)
        send = torch.zeros(m, dtype=input.dtype, device=input.device)
        send[:n].copy_(input.reshape(-1))
        recv = torch.empty(m * g.size, dtype=input.dtype, device=input.device)

        def unpack() -> None:
            for i, o in enumerate(output):
                o.copy_(recv[i * m : i * m + sizes[i]].view(o.shape))

        then.append(unpack)
    what = _what("all_gather", g, input)
    work = launch(g, what, lambda: ops.all_gather(recv, send))
    return finish(Handle(g, what, [work], then), async_op)


def broadcast(
    tensor: torch.Tensor, src: int, group: ProcessGroup | None = None, async_op: bool = False
) -> Handle | None:
    """Copies global rank `src`'s tensor to every rank of the group."""
    g = resolve(group)
    _check_tensor("broadcast", "tensor", tensor)
    root = _root(g, "broadcast", "src", src)
    debug.check(
        g, "broadcast", dtype=tensor.dtype, device=tensor.device.type, root=src, shape=tensor.shape
    )
    if g.size == 1:
        return finish(Handle.local(g, tensor.device), async_op)
    ops = ops_for(g, tensor.device)
    then: Then = []
    flat = _staged(tensor, then)
    what = _what("broadcast", g, tensor)
    work = launch(g, what, lambda: ops.broadcast(flat, root))
    return finish(Handle(g, what, [work], then), async_op)


def reduce(
    tensor: torch.Tensor,
    dst: int,
    op: str = "sum",
    group: ProcessGroup | None = None,
    async_op: bool = False,
) -> Handle | None:
    """Reduces into global rank `dst`'s tensor; the others' tensors are left unspecified."""
    g = resolve(group)
    _check_tensor("reduce", "tensor", tensor)
    _check_op("reduce", op, tensor.dtype)
    root = _root(g, "reduce", "dst", dst)
    debug.check(
        g,
        "reduce",
        dtype=tensor.dtype,
        device=tensor.device.type,
        redop=op,
        root=dst,
        shape=tensor.shape,
    )
    if g.size == 1:
        return finish(Handle.local(g, tensor.device), async_op)
    ops = ops_for(g, tensor.device)
    then: Then = []
    flat = _staged(tensor, then)
    native = op
    if op == "avg" and not ops.native_avg:
        native = "sum"
        if g.rank == root:
            then.insert(0, lambda: _divide(flat, g.size))
    what = _what("reduce", g, tensor)
    work = launch(g, what, lambda: ops.reduce(flat, root, native))
    return finish(Handle(g, what, [work], then), async_op)


def all_to_all(
    output: torch.Tensor,
    input: torch.Tensor,
    output_split_sizes: Sequence[int] | None = None,
    input_split_sizes: Sequence[int] | None = None,
    group: ProcessGroup | None = None,
    async_op: bool = False,
) -> Handle | None:
    """Rank i's input rows for rank j land in rank j's output, in rank order (dim 0 is split).

    Without split sizes the rows split evenly (dim 0 must divide by the group size);
    input_split_sizes[j] rows go to rank j, output_split_sizes[i] rows come from rank i.
    """
    g = resolve(group)
    _check_tensor("all_to_all", "input", input)
    _check_like("all_to_all", input, [output], "output")
    if input.dim() == 0 or output.dim() == 0:
        raise ValueError("all_to_all: input and output need at least one dimension (rows)")
    if input.shape[1:] != output.shape[1:]:
        raise ValueError(
            f"all_to_all: input rows have shape {list(input.shape[1:])} but output rows "
            f"{list(output.shape[1:])}: the dimensions after the first must match"
        )
    in_rows = _splits(g, "input", input, input_split_sizes)
    out_rows = _splits(g, "output", output, output_split_sizes)
    even = input_split_sizes is None and output_split_sizes is None
    if even and input.shape[0] != output.shape[0]:
        raise ValueError(
            f"all_to_all: input has {input.shape[0]} rows but output {output.shape[0]}: with even "
            "splits they must match (pass split sizes for uneven exchanges)"
        )
    debug.check(
        g,
        "all_to_all",
        dtype=input.dtype,
        device=input.device.type,
        shape=input.shape[1:],
        splits=(in_rows, out_rows),
    )
    if g.size == 1:
        output.copy_(input)
        return finish(Handle.local(g, input.device), async_op)
    ops = ops_for(g, input.device)
    then: Then = []
    send = input.contiguous()
    recv = _staged(output, then).view(output.shape)
    what = _what("all_to_all", g, input)
    rows = (None, None) if even else (out_rows, in_rows)
    work = launch(g, what, lambda: ops.all_to_all(recv, send, *rows))
    return finish(Handle(g, what, [work], then), async_op)


def barrier(group: ProcessGroup | None = None, async_op: bool = False) -> Handle | None:
    """Returns when every rank of the group has reached it (a host-side Gloo barrier)."""
    g = resolve(group)
    debug.check(g, "barrier")
    if g.size == 1:
        return finish(Handle.done(), async_op)
    ops = ops_for(g, torch.device("cpu"))
    what = f"barrier on group {g.name!r}"
    work = launch(g, what, ops.barrier)
    return finish(Handle(g, what, [work]), async_op)


def _root(g: ProcessGroup, op: str, name: str, rank: int) -> int:
    if rank not in g.ranks:
        raise ValueError(
            f"{op}: {name}={rank} is not a rank of group {g.name!r} (global ranks {list(g.ranks)}); "
            f"{name} is a global rank, as in torch.distributed"
        )
    return g.group_rank(rank)


def _splits(g: ProcessGroup, name: str, t: torch.Tensor, splits: Sequence[int] | None) -> list[int]:
    rows = t.shape[0]
    if splits is None:
        if rows % g.size:
            raise ValueError(
                f"all_to_all: {name} has {rows} rows (dim 0), not divisible by the group size "
                f"{g.size}: pass {name}_split_sizes (rows per rank) for an uneven exchange"
            )
        return [rows // g.size] * g.size
    splits = [int(s) for s in splits]
    if len(splits) != g.size or min(splits) < 0 or sum(splits) != rows:
        raise ValueError(
            f"all_to_all: {name}_split_sizes={splits} must be {g.size} non-negative row counts "
            f"summing to {name}'s {rows} rows (dim 0); they sum to {sum(splits)}"
        )
    return splits
