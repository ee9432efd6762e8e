"""reduce_scatter (size = the input), engine beside torch.distributed's
reduce_scatter_tensor; busbw = algbw * (n-1)/n.

    python -m torch.distributed.run --nproc_per_node N benchmarks/comm/reduce_scatter.py --out r.jsonl
"""

import torch.distributed as dist
from common import Collective, run, torch_reduce_op

REDUCE_SCATTER = Collective(
    name="reduce_scatter",
    busbw_factor=lambda n: (n - 1) / n,
    buffers=lambda count, n: (count, count // n),
    engine=lambda comm, send, recv, op, stream: comm.reduce_scatter(send, recv, op, stream),
    torch_op=lambda send, recv, op: dist.reduce_scatter_tensor(recv, send, op=torch_reduce_op(op)),
    count_multiple_of_world=True,
)

if __name__ == "__main__":
    run(REDUCE_SCATTER)
