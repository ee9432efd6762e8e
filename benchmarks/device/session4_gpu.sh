#!/usr/bin/env bash
# One call on nvidia-h200: build with CUDA, the GPU tests (engine memory, optimizers,
# comm, megalith_zero), then the 1.3B GPT through every path (benchmarks/zero/gpu_gpt.py):
# plain torch, ZeRO-2/3, host offload, the Booster's plugins and the tp-1 code path.
source "$(dirname "$0")/setup.sh"
build comm zero pipeline offload
log pytest-gpu
timeout ${PYTEST_LIMIT:-200} python3 -m pytest -p no:cacheprovider -q -rs -x --timeout 180 \
  tests/test_zero_gpu.py tests/test_memory.py tests/test_optim_cuda.py tests/test_comm_gpu.py \
  2>&1 | tail -30 | tee "$OUT/pytest_gpu.txt"
log bench
timeout ${BENCH_LIMIT:-300} python3 -m torch.distributed.run --nproc_per_node 1 benchmarks/zero/gpu_gpt.py \
  --batch 16 --modes "${MODES:-torch,zero2,zero3,booster-ddp,booster-zero2,hybrid-tp1,tp1-layers,zero2-offload}" \
  --out "$OUT/gpt1p3b.md" 2>&1 | grep -v "^W" | tail -40
log done
