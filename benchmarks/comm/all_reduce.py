"""all_reduce (in place), engine beside torch.distributed; busbw = algbw * 2(n-1)/n.

python -m torch.distributed.run --nproc_per_node N benchmarks/comm/all_reduce.py --out r.jsonl
"""

import torch.distributed as dist
from common import Collective, run, torch_reduce_op

ALL_REDUCE = Collective(
    name="all_reduce",
    busbw_factor=lambda n: 2 * (n - 1) / n,
    buffers=lambda count, n: (count, 0),
    engine=lambda comm, send, recv, op, stream: comm.all_reduce(send, send, op, stream),
    torch_op=lambda send, recv, op: dist.all_reduce(send, op=torch_reduce_op(op)),
    in_place=True,
)

if __name__ == "__main__":
    run(ALL_REDUCE)
