#!/usr/bin/env bash
# Issue 20, deliverable 1: ZeRO-Offload at realistic batches on one GPU (nvidia-h200;
# pinned to CORES, default 0-15, the one-GPU box's 16 cores): each optimizer step is
# TOKENS tokens (default "16384 65536 163840"), gradient accumulation over micro-batches
# of seq 2048 (benchmarks/zero/gpu_gpt.py --tokens-per-step; all micro-batches but the
# last under no_sync, the host update in the last one's backward), every token count
# measured on the same built model. Rows: tokens/s, 6N-TFLOPS (6 * params * tokens/s,
# MegaTrain's basis) and MFU. Results: benchmarks/results/offload_gpu/.
# SECTIONS picks the parts (default "6p7b"); each is sized for one call of ~9 minutes:
#   6p7b       gpt-6.7b, micro-batch MB_6P7B (8), ckpt: plain torch (no offload, fused
#              AdamW) at 65536 tokens per step for the ratio, then ZeRO-2 with every master
#              and state on the host at each of TOKENS;
#   6p7b-torch plain torch at each of TOKENS (the ratio at every batch);
#   12b        gpt-13b with 38 layers (12.2B), micro-batch MB_12B (4), ckpt: states of the
#              first chunks on the GPU up to DEVICE_GB_12B (64: the larger micro-batch's
#              activations need some of the room the 73 of offload_bench.sh's micro-batch
#              1 gave states; accumulating gradients needs none on one rank, see
#              [Note: local accumulation] in megalith_zero/grads.py), the rest on the host;
#   14b        gpt-13b with 44 layers (14.1B), micro-batch MB_14B (2), bf16 init, host
#              offload alone: DEVICE_GB_14B (70) of states on the GPU, the rest on the host
#              under HOST_GB (110).
# STEPS (2) timed steps at each token count, WARMUP (1) steps before the first.
source "$(dirname "$0")/setup.sh"
build
TOKENS=${TOKENS:-16384 65536 163840}
tokens_csv=${TOKENS// /,}
STEPS=${STEPS:-2}
WARMUP=${WARMUP:-1}
timing=(--steps "$STEPS" --warmup "$WARMUP")
for section in ${SECTIONS:-6p7b}; do
  case $section in
  6p7b)
    bench batches_6p7b_torch 240 --model gpt-6.7b --ckpt --batch "${MB_6P7B:-8}" "${timing[@]}" \
      --tokens-per-step 65536 --modes torch
    bench batches_6p7b_zero2-offload 360 --model gpt-6.7b --ckpt --batch "${MB_6P7B:-8}" \
      "${timing[@]}" --tokens-per-step "$tokens_csv" --modes zero2-offload ;;
  6p7b-torch)
    bench batches_6p7b_torch_all 360 --model gpt-6.7b --ckpt --batch "${MB_6P7B:-8}" \
      "${timing[@]}" --tokens-per-step "$tokens_csv" --modes torch ;;
  12b)
    bench batches_12b_zero2-offload 540 --model gpt-13b --layers 38 --ckpt --batch "${MB_12B:-4}" \
      "${timing[@]}" --tokens-per-step "$tokens_csv" --optim-frac 0 \
      --device-budget-gb "${DEVICE_GB_12B:-64}" --modes zero2-offload ;;
  14b)
    bench batches_14b_zero2-offload 540 --model gpt-13b --layers 44 --ckpt --batch "${MB_14B:-2}" \
      "${timing[@]}" --tokens-per-step "$tokens_csv" --init-dtype bf16 --tier host --optim-frac 0 \
      --device-budget-gb "${DEVICE_GB_14B:-70}" --host-budget-gb "${HOST_GB:-110}" \
      --modes zero2-offload ;;
  *) log "unknown section $section" ;;
  esac
done
log done
