#!/usr/bin/env bash
# ZeRO-Offload on one GPU (nvidia-h200; on a larger host CORES, default 0-15, pins every
# run to 16 cores, the core count of the one-GPU H200 box of ../shared/ANCHORS.md, so the
# host update is measured on the same core count): host offload of ZeRO's fp32 masters and
# optimizer states (benchmarks/zero/gpu_gpt.py, each run its own process) beside plain
# torch. Results: benchmarks/results/offload_gpu/. SECTIONS picks the parts (default
# "gpt1p3b gpt6p7b gpt12b"):
#   gpt1p3b   torch, offload with the update during backward and after it, ZeRO-3 offload;
#   gpt6p7b   micro-batch 8, checkpointing;
#   gpt12b    38 layers of d5120, the 12.2B of ANCHORS, micro-batch 1: states of the first
#             chunks on the GPU up to DEVICE_GB_12B, the rest on the host, whose gradients
#             come first in backward, so their update overlaps it;
#   gpt12b-visit  the same with part of the host chunks updated by the GPU (VISIT_FRACS);
#   auto      automatic placement against static full offload (1.3B ZeRO-2 and ZeRO-3 with
#             every parameter shard on the host, 6.7B);
#   largest-host  the largest with host offload alone (44 layers of d5120, 14.1B);
#   largest   57 layers of d5120, 18.2B: states on the GPU up to DEVICE_GB, then host
#             memory up to HOST_GB with the masters, then NVMe under SWAP; sized with
#             `megalith plan` for the H200 box: 133 GB of GPU before activations, 109 GB
#             host, 55 GB NVMe;
#   largest-nvme-masters  the same 18.2B with the NVMe chunks' fp32 masters in their files.
# Each of gpt12b, largest* takes 5-7 minutes: one or two per call.
source "$(dirname "$0")/setup.sh"
build
SWAP=${SWAP:-$SCRATCH/swap}
for section in ${SECTIONS:-gpt1p3b gpt6p7b gpt12b}; do
  case $section in
  gpt1p3b)
    for m in ${MODES_1P3B:-torch zero2-offload zero2-offload-after zero3-offload}; do
      bench "1p3b_$m" 150 --batch 16 --modes "$m"
    done ;;
  gpt6p7b)
    for m in ${MODES_6P7B:-zero2-offload}; do
      bench "6p7b_$m" 240 --model gpt-6.7b --ckpt --batch 8 --steps 3 --warmup 2 --modes "$m"
    done ;;
  gpt12b)
    bench 12b_zero2-offload 300 --model gpt-13b --layers 38 --ckpt --batch 1 --steps 3 --warmup 1 \
      --optim-frac 0 --device-budget-gb "${DEVICE_GB_12B:-73}" --modes zero2-offload ;;
  gpt12b-visit)  # part of the host chunks updated by the GPU, states streamed; "auto"
    # chooses the part from the first step's timings (row: visit_frac, visit_ns_per_param)
    for v in ${VISIT_FRACS:-0.3 0.5 auto}; do
      bench "12b_visit$v" 300 --model gpt-13b --layers 38 --ckpt --batch 1 --steps 3 --warmup 1 \
        --optim-frac 0 --device-budget-gb "${DEVICE_GB_12B:-73}" --modes zero2-offload --visit-frac "$v"
    done ;;
  auto)  # placement="auto" against static full offload (the first two rows at stage 2,
    # then stage 3 with the shards on the host: the warm-up as params_host, then back)
    bench 1p3b_static 120 --batch 16 --steps 6 --warmup 2 --modes zero2-offload
    bench 1p3b_auto 120 --batch 16 --steps 6 --warmup 2 --modes zero2-offload --placement auto
    bench 1p3b_zero3_params_host 150 --batch 16 --steps 6 --warmup 2 --modes zero3-offload \
      --param-frac 1
    bench 1p3b_zero3_auto 150 --batch 16 --steps 6 --warmup 2 --modes zero3-offload \
      --placement auto
    bench 6p7b_auto 240 --model gpt-6.7b --ckpt --batch 8 --steps 3 --warmup 2 \
      --modes zero2-offload --placement auto ;;
  largest-host)  # the largest with CPU offload alone, no NVMe: 44 layers of d5120, 14.1B
    # (megalith plan: GPU 125-130 GB before activations, host 100 GB)
    bench largest-host_zero2-offload 360 --model gpt-13b --layers "${LAYERS_HOST:-44}" --ckpt \
      --batch 1 --steps 3 --warmup 0 --init-dtype bf16 --tier host --optim-frac 0 \
      --device-budget-gb "${DEVICE_GB_HOST:-74}" --host-budget-gb "${HOST_GB:-110}" \
      --modes zero2-offload ;;
  largest)
    mkdir -p "$SWAP"
    bench largest_zero2-offload "${LIMIT_LARGEST:-420}" --model gpt-13b --layers "${LAYERS:-57}" \
      --ckpt --batch 1 --steps 3 --warmup 0 --init-dtype bf16 --tier host+nvme --optim-frac 0 \
      --device-budget-gb "${DEVICE_GB:-60}" --host-budget-gb "${HOST_GB:-110}" \
      --swap-dir "$SWAP" --modes zero2-offload
    df -h "$SWAP" | tail -1 ;;
  largest-nvme-masters)  # the same 18.2B with the NVMe chunks' fp32 masters in their files
    # (megalith plan --master-tier nvme: 24 chunks on the GPU, 40 on the host, 23 on NVMe,
    # 57.9 GB of files; the box's 64 GiB disk, not its host RAM, bounds the model then)
    mkdir -p "$SWAP"
    bench largest-nm_zero2-offload "${LIMIT_LARGEST:-420}" --model gpt-13b --layers "${LAYERS:-57}" \
      --ckpt --batch 1 --steps 3 --warmup 0 --init-dtype bf16 --tier host+nvme --optim-frac 0 \
      --device-budget-gb "${DEVICE_GB:-60}" --host-budget-gb "${HOST_GB:-110}" --master-tier nvme \
      --swap-dir "$SWAP" --modes zero2-offload
    df -h "$SWAP" | tail -1 ;;
  *) log "unknown section $section" ;;
  esac
done
log done
