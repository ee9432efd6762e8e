#!/usr/bin/env bash
# nvidia-h200: build, then (1) per-step losses of the 1.3B GPT under torch and ZeRO 2/3
# (stage 3 also without prefetch and with CUDA_LAUNCH_BLOCKING=1, which rules out stream
# races), (2) the 1.3B paths that need their own process (benchmarks/zero/gpu_gpt.py).
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
log losses
for m in torch zero2 zero3 zero3-noprefetch; do run1 benchmarks/zero/gpu_loss_check.py --mode $m | tail -3; done | tee "$OUT/losses.txt"
CUDA_LAUNCH_BLOCKING=1 run1 benchmarks/zero/gpu_loss_check.py --mode zero3 | tail -3 | sed 's/zero3/zero3-launch-blocking/' | tee -a "$OUT/losses.txt"
for m in ${MODES:-torch booster-ddp hybrid-tp1 tp1-layers zero2 zero3 booster-zero2 torch}; do
  log "bench $m"
  run1 benchmarks/zero/gpu_gpt.py --batch 16 --modes $m --out "/tmp/gpt_$m.md" > "/tmp/gpt_$m.log"
  grep "'mode'" "/tmp/gpt_$m.log" || tail -5 "/tmp/gpt_$m.log"
  tail -1 "/tmp/gpt_$m.md" >> "$OUT/gpt1p3b_rows.md"
done
cat "$OUT/gpt1p3b_rows.md"
log done
