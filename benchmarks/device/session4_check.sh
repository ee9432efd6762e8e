#!/usr/bin/env bash
# nvidia-h200: build, then (1) per-step losses of the 1.3B GPT under torch and ZeRO 2/3
# (stage 3 also without prefetch and with CUDA_LAUNCH_BLOCKING=1, which rules out stream
# races), (2) the 1.3B paths that need their own process (benchmarks/zero/gpu_gpt.py).
source "$(dirname "$0")/setup.sh"
build comm zero pipeline offload
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
