#!/usr/bin/env bash
# nvidia-h200: build with CUDA, then benchmarks/zero/gpu_gpt.py on the 1.3B GPT through
# every path and on the 6.7B GPT (activation checkpointing) plain vs host offload.
source "$(dirname "$0")/setup.sh"
build comm zero pipeline offload
bench() {  # name, limit, args...
  local name=$1 limit=$2; shift 2
  log "$name"
  timeout "$limit" python3 -m torch.distributed.run --nproc_per_node 1 benchmarks/zero/gpu_gpt.py \
    --out "$OUT/$name.md" "$@" > "$OUT/$name.log" 2>&1
  grep -v "^W" "$OUT/$name.log" | grep -A3 "Error\|error" | head -20
  cat "$OUT/$name.md" 2>/dev/null || tail -20 "$OUT/$name.log"
}
bench gpt1p3b ${LIMIT_1P3B:-300} --batch 16 \
  --modes "${MODES_1P3B:-torch,zero2,zero3,booster-ddp,booster-zero2,hybrid-tp1,tp1-layers,zero2-offload,torch}"
bench gpt6p7b ${LIMIT_6P7B:-200} --model gpt-6.7b --ckpt --batch 8 --steps 3 --warmup 2 \
  --modes "${MODES_6P7B:-torch,zero2-offload}"
log done
