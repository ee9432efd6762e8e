#!/usr/bin/env bash
# ZeRO on one GPU (nvidia-h200): the GPT of megalith.models through every path of
# benchmarks/zero/gpu_gpt.py, each row its own process (rows of one process leaked engine
# memory into the next), and the per-step losses of benchmarks/zero/gpu_loss_check.py.
# Results: benchmarks/results/zero_gpu/. SECTIONS picks the parts (default "gpt1p3b"):
#   gpt1p3b  the 1.3B GPT, micro-batch 16, under MODES_1P3B (plain torch, ZeRO-2/3, the
#            Booster's plugins, the tensor-parallel code path at tp 1, host offload);
#   gpt6p7b  the 6.7B GPT with activation checkpointing, plain torch against host offload;
#   losses   per-step losses of the 1.3B under torch and ZeRO-2/3 (stage 3 also without
#            prefetch and with CUDA_LAUNCH_BLOCKING=1, which rules out stream races);
#   keep-gathered  ZeRO-3 beside ZeRO-3 with 3 GB of chunks kept gathered from forward to
#            backward (ZeroConfig.keep_gathered_bytes).
source "$(dirname "$0")/setup.sh"
SECTIONS=${SECTIONS:-gpt1p3b}
build
for section in $SECTIONS; do
  case $section in
  gpt1p3b)
    for m in ${MODES_1P3B:-torch zero2 zero3 booster-ddp booster-zero2 hybrid-tp1 tp1-layers zero2-offload}; do
      bench "1p3b_$m" "${LIMIT_1P3B:-150}" --batch 16 --modes "$m"
    done ;;
  gpt6p7b)
    for m in ${MODES_6P7B:-torch zero2-offload}; do
      bench "6p7b_$m" "${LIMIT_6P7B:-200}" --model gpt-6.7b --ckpt --batch 8 --steps 3 --warmup 2 \
        --modes "$m"
    done ;;
  losses)
    log losses
    for m in torch zero2 zero3 zero3-noprefetch; do
      run1 benchmarks/zero/gpu_loss_check.py --mode $m | tail -3
    done | tee "$OUT/losses.txt"
    CUDA_LAUNCH_BLOCKING=1 run1 benchmarks/zero/gpu_loss_check.py --mode zero3 | tail -3 \
      | sed 's/zero3/zero3-launch-blocking/' | tee -a "$OUT/losses.txt" ;;
  keep-gathered)
    bench 1p3b_zero3 120 --batch 16 --steps 6 --warmup 2 --modes zero3
    bench 1p3b_zero3_keep 120 --batch 16 --steps 6 --warmup 2 --modes zero3 --keep-gathered-gb 3 ;;
  *) log "unknown section $section" ;;
  esac
done
log done
