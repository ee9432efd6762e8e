"""broadcast from rank 0 (in place), engine beside torch.distributed; busbw = algbw.

python -m torch.distributed.run --nproc_per_node N benchmarks/comm/broadcast.py --out r.jsonl
"""

import torch.distributed as dist
from common import Collective, run

BROADCAST = Collective(
    name="broadcast",
    busbw_factor=lambda n: 1.0,
    buffers=lambda count, n: (count, 0),
    engine=lambda comm, send, recv, op, stream: comm.broadcast(send, 0, stream),
    torch_op=lambda send, recv, op: dist.broadcast(send, src=0),
    in_place=True,
)

if __name__ == "__main__":
    run(BROADCAST)
