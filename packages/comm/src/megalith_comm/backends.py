"""The two transports behind one API: Gloo (CPU tensors) and the engine's NCCL (CUDA).

Both take flat contiguous tensors and ranks within the group, enqueue one operation,
and return something with wait() and is_completed().

Gloo in torch 2.13 (checked op by op, world sizes 2-4): all_reduce, reduce_scatter,
all_gather, broadcast, reduce and all_to_all accept float32/64, float16, bfloat16 and
the integer types, with sum/min/max/prod. It refuses AVG on integer tensors, so
"avg" is never passed to Gloo: collectives.py sums and divides instead (the same on
every dtype). No dtype needs converting through float32 on this torch.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist

from .handle import StreamWork

OPS = ("sum", "avg", "min", "max", "prod")
_GLOO_OP = {
    "sum": dist.ReduceOp.SUM,
    "min": dist.ReduceOp.MIN,
    "max": dist.ReduceOp.MAX,
    "prod": dist.ReduceOp.PRODUCT,
}
# torch 2.13 renamed the flat forms (the old names warn); older torch has only the old.
_reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


class GlooOps:
    native_avg = False

    def __init__(self, group: Any):
        self.group = group
        self.pg = group.gloo

    def all_reduce(self, t: torch.Tensor, op: str) -> Any:
        return dist.all_reduce(t, op=_GLOO_OP[op], group=self.pg, async_op=True)

    def reduce_scatter(self, out: torch.Tensor, inp: torch.Tensor, op: str) -> Any:
        return _reduce_scatter(out, inp, op=_GLOO_OP[op], group=self.pg, async_op=True)

    def all_gather(self, out: torch.Tensor, inp: torch.Tensor) -> Any:
        return _all_gather(out, inp, group=self.pg, async_op=True)

    def broadcast(self, t: torch.Tensor, root: int) -> Any:
        return dist.broadcast(t, src=self.group.ranks[root], group=self.pg, async_op=True)

    def reduce(self, t: torch.Tensor, root: int, op: str) -> Any:
        return dist.reduce(
            t, dst=self.group.ranks[root], op=_GLOO_OP[op], group=self.pg, async_op=True
        )

    def all_to_all(
        self,
        out: torch.Tensor,
        inp: torch.Tensor,
        out_rows: Sequence[int] | None,
        in_rows: Sequence[int] | None,
    ) -> Any:
        return dist.all_to_all_single(
            out,
            inp,
            output_split_sizes=out_rows,
            input_split_sizes=in_rows,
            group=self.pg,
            async_op=True,
        )

    def barrier(self) -> Any:
        return dist.barrier(group=self.pg, async_op=True)

    def p2p(self, ops: Sequence[tuple[str, torch.Tensor, int, int]]) -> list[Any]:
        """ops: (kind "send"/"recv", tensor, peer group rank, tag), posted as one batch."""
        batch = [
            dist.P2POp(
                dist.isend if kind == "send" else dist.irecv,
                t,
                self.group.ranks[peer],
                self.pg,
                tag,
            )
            for kind, t, peer, tag in ops
        ]
        return dist.batch_isend_irecv(batch)


class NcclOps:
    """The group's NCCL communicator; every op on the caller's current stream."""

    native_avg = True

    def __init__(self, group: Any, device: torch.device):
        self.device = device
        self.comm = group.nccl(device)

    def _stream(self) -> int:
        return torch.cuda.current_stream(self.device).cuda_stream

    def _w(self, work: Any) -> StreamWork:
        return StreamWork(work, self.device)

    def all_reduce(self, t: torch.Tensor, op: str) -> Any:
        return self._w(self.comm.all_reduce(t, t, op=op, stream=self._stream()))

    def reduce_scatter(self, out: torch.Tensor, inp: torch.Tensor, op: str) -> Any:
        return self._w(self.comm.reduce_scatter(inp, out, op=op, stream=self._stream()))

    def all_gather(self, out: torch.Tensor, inp: torch.Tensor) -> Any:
        return self._w(self.comm.all_gather(inp, out, stream=self._stream()))

    def broadcast(self, t: torch.Tensor, root: int) -> Any:
        return self._w(self.comm.broadcast(t, root, stream=self._stream()))

    def reduce(self, t: torch.Tensor, root: int, op: str) -> Any:
        return self._w(self.comm.reduce(t, t, root, op=op, stream=self._stream()))

    def all_to_all(
        self,
        out: torch.Tensor,
        inp: torch.Tensor,
        out_rows: Sequence[int] | None,
        in_rows: Sequence[int] | None,
    ) -> Any:
        flat_in, flat_out = inp.view(-1), out.view(-1)
        if out_rows is None and in_rows is None:
            return self._w(self.comm.all_to_all(flat_in, flat_out, stream=self._stream()))
        row = math.prod(inp.shape[1:])  # elements per dim-0 row (the engine counts elements)
        send_counts = [r * row for r in in_rows]
        recv_counts = [r * row for r in out_rows]
        return self._w(
            self.comm.all_to_allv(
                flat_in, send_counts, flat_out, recv_counts, stream=self._stream()
            )
        )

    def barrier(self) -> Any:
        return self._w(self.comm.barrier(stream=self._stream()))

    def p2p(self, ops: Sequence[tuple[str, torch.Tensor, int, int]]) -> list[Any]:
        """NCCL has no tags: messages to one peer arrive in order; tag is ignored here."""
        stream = self._stream()
        works = []
        self.comm.group_start()
        try:
            for kind, t, peer, _tag in ops:
                fn = self.comm.send if kind == "send" else self.comm.recv
                works.append(self._w(fn(t, peer, stream=stream)))
        finally:
            self.comm.group_end()
        return works


def ops_for(group: Any, device: torch.device) -> GlooOps | NcclOps:
    if device.type == "cpu":
        return GlooOps(group)
    if device.type == "cuda":
        return NcclOps(group, device)
    raise ValueError(f"megalith_comm communicates CPU and CUDA tensors, not {device.type} tensors")
