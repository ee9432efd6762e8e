#!/usr/bin/env bash
# Second comm call on nvidia-h200-x2: megalith_comm's CUDA path over two GPUs,
# the engine's GPU tests, and the all_reduce latency at world size 2 with NCCL
# in blocking and in non-blocking mode (MEGALITH_NCCL_BLOCKING).
set -uo pipefail
export PYTHONUNBUFFERED=1 CMAKE_BUILD_PARALLEL_LEVEL=32
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
log() { echo "=== $* ($(date +%T))"; }
log build
MEGALITH_CUDA=ON python3 -m pip install --no-build-isolation --no-deps -q . ./packages/comm > "$OUT/build.txt" 2>&1 || { tail -40 "$OUT/build.txt"; exit 1; }
export MEGALITH_NCCL_PATH=$(python3 -c 'import nvidia, os; print(os.path.join(list(nvidia.__path__)[0], "nccl", "lib"))')
log pytest-gpu
timeout 400 python3 -m pytest -p no:cacheprovider -q -rs tests/test_comm_gpu.py tests/test_comm_engine_gpu.py tests/test_optim_cuda.py tests/test_engine_errors.py 2>&1 | tail -25 | tee "$OUT/pytest_gpu.txt"
log latency
for mode in 1 0; do
  echo "MEGALITH_NCCL_BLOCKING=$mode"
  MEGALITH_NCCL_BLOCKING=$mode timeout 120 python3 -m torch.distributed.run --nproc_per_node 2 benchmarks/comm/all_reduce.py -e 1M --out "$OUT/allreduce_w2_blocking$mode.jsonl" 2>&1 | grep -v "^W" | tail -20
done | tee "$OUT/latency.txt"
log done
