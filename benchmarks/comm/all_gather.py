"""all_gather (size = the gathered output), engine beside torch.distributed's
all_gather_into_tensor; busbw = algbw * (n-1)/n.

    python -m torch.distributed.run --nproc_per_node N benchmarks/comm/all_gather.py --out r.jsonl
"""

import torch.distributed as dist
from common import Collective, run

ALL_GATHER = Collective(
    name="all_gather",
    busbw_factor=lambda n: (n - 1) / n,
    buffers=lambda count, n: (count // n, count),
    engine=lambda comm, send, recv, op, stream: comm.all_gather(send, recv, stream),
    torch_op=lambda send, recv, op: dist.all_gather_into_tensor(recv, send),
    count_multiple_of_world=True,
)

if __name__ == "__main__":
    run(ALL_GATHER)
