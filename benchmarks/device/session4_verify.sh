#!/usr/bin/env bash
# nvidia-h200: after the one-rank stream fix in megalith_comm, the GPU tests that catch
# it and the per-step losses of ZeRO-2/3 again, then ZeRO-2/3 throughput.
set -uo pipefail
export PYTHONUNBUFFERED=1 CMAKE_BUILD_PARALLEL_LEVEL=16
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
log() { echo "=== $* ($(date +%T))"; }
log build
MEGALITH_CUDA=ON python3 -m pip install --no-build-isolation --no-deps -q . ./packages/comm \
  ./packages/zero ./packages/pipeline ./packages/offload > "$OUT/build.txt" 2>&1 || { tail -40 "$OUT/build.txt"; exit 1; }
run1() { timeout 120 python3 -m torch.distributed.run --nproc_per_node 1 "$@" 2>&1 | grep -v "^W"; }
log pytest
timeout 200 python3 -m pytest -p no:cacheprovider -q -rs --timeout 180 tests/test_comm_gpu.py tests/test_zero_gpu.py 2>&1 | tail -15 | tee "$OUT/pytest_gpu.txt"
log losses
for m in zero2 zero3 zero3-noprefetch; do run1 benchmarks/zero/gpu_loss_check.py --mode $m | tail -2; done | tee "$OUT/losses.txt"
for m in zero3 zero2; do
  log "bench $m"
  run1 benchmarks/zero/gpu_gpt.py --batch 16 --modes $m --out "/tmp/gpt_$m.md" > "/tmp/gpt_$m.log"
  grep "'mode'" "/tmp/gpt_$m.log" || tail -5 "/tmp/gpt_$m.log"
done
log done
