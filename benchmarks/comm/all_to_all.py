"""all_to_all with equal blocks (size = the input), engine beside torch.distributed's
all_to_all_single; busbw = algbw * (n-1)/n.

    python -m torch.distributed.run --nproc_per_node N benchmarks/comm/all_to_all.py --out r.jsonl
"""

import torch.distributed as dist
from common import Collective, run

ALL_TO_ALL = Collective(
    name="all_to_all",
    busbw_factor=lambda n: (n - 1) / n,
    buffers=lambda count, n: (count, count),
    engine=lambda comm, send, recv, op, stream: comm.all_to_all(send, recv, stream),
    torch_op=lambda send, recv, op: dist.all_to_all_single(recv, send),
    count_multiple_of_world=True,
)

if __name__ == "__main__":
    run(ALL_TO_ALL)
