#!/usr/bin/env bash
# The fused AdamW on the GPU and on the many-core host of a lent machine: results in
# benchmarks/results/optim_gpu/ and optim_host/. SECTIONS picks the parts (default
# "gpu_adam host_adam"):
#   gpu_adam   benchmarks/optim/gpu_adam.py: 1e9 fp32 params in 8 flat tensors and in 292
#              GPT-shaped ones beside torch's fused AdamW and the copy-bandwidth ceiling;
#   host_adam  benchmarks/optim/host_adam_large.py over 1e9 params on 16 threads, pinned to
#              $CORES (default 0-15, the core count of the one-GPU H200 box), beside torch's
#              fused AdamW on the same memory.
source "$(dirname "$0")/setup.sh"
SECTIONS=${SECTIONS:-gpu_adam host_adam}
build
machine_info > /dev/null
if has_section gpu_adam; then
  log gpu_adam
  timeout 400 python3 benchmarks/optim/gpu_adam.py --out "$OUT/gpu_adam.jsonl" 2>&1 | tee "$OUT/gpu_adam.txt"
fi
if has_section host_adam; then
  log host_adam
  timeout 300 taskset -c "${CORES:-0-15}" python3 benchmarks/optim/host_adam_large.py --n 1e9 \
    --threads 16 --steps 5 --out "$OUT/host_adam.jsonl" 2>&1 | tee "$OUT/host_adam.txt"
fi
log done
