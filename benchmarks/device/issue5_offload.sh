#!/usr/bin/env bash
# Issue 5 on a lent GPU machine: host offload of ZeRO's fp32 masters and optimizer states
# (benchmarks/zero/gpu_gpt.py, each run its own process) beside plain torch. On a host with
# more cores than the 16-core H200 machine of ../shared/ANCHORS.md, CORES (default 0-15)
# pins every run to 16 of them so the host update is measured on the same core count.
# SECTIONS picks the parts: gpt1p3b (torch, offload with the update during backward and
# after it), gpt6p7b (micro-batch 8, checkpointing), gpt12b (38 layers of d5120, the 12.2B
# of ANCHORS, micro-batch 1: states of the first chunks on the GPU up to DEVICE_GB_12B, the
# rest on the host, whose gradients come first in backward, so their update overlaps it),
# largest (57 layers of d5120, 18.2B: states on the GPU up to DEVICE_GB, then host memory up
# to HOST_GB with the masters, then NVMe under SWAP; sized with `megalith plan`
# for the H200 box: 133 GB of GPU before activations, 109 GB host, 55 GB NVMe).
source "$(dirname "$0")/setup.sh"
build comm zero pipeline offload
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
  largest-host)  # the largest with CPU offload alone, no NVMe: 44 layers of d5120, 14.1B
    # (megalith plan: GPU 125-130 GB before activations, host 100 GB)
    bench largest-host_zero2-offload 360 --model gpt-13b --layers "${LAYERS_HOST:-44}" --ckpt \
      --batch 1 --steps 3 --warmup 0 --init-dtype bf16 --tier host --optim-frac 0 \
      --device-budget-gb "${DEVICE_GB_HOST:-74}" --host-budget-gb "${HOST_GB:-110}" \
      --modes zero2-offload ;;
  largest)
    mkdir -p "${SWAP:-/tmp/swap}"
    bench largest_zero2-offload "${LIMIT_LARGEST:-420}" --model gpt-13b --layers "${LAYERS:-57}" \
      --ckpt --batch 1 --steps 3 --warmup 0 --init-dtype bf16 --tier host+nvme --optim-frac 0 \
      --device-budget-gb "${DEVICE_GB:-60}" --host-budget-gb "${HOST_GB:-110}" \
      --swap-dir "${SWAP:-/tmp/swap}" --modes zero2-offload
    df -h "${SWAP:-/tmp/swap}" | tail -1 ;;
  largest-nvme-masters)  # the same 18.2B with the NVMe chunks' fp32 masters in their files
    # (megalith plan --master-tier nvme: 24 chunks on the GPU, 40 on the host, 23 on NVMe,
    # 57.9 GB of files; the box's 64 GiB disk, not its host RAM, bounds the model then)
    mkdir -p "${SWAP:-/tmp/swap}"
    bench largest-nm_zero2-offload "${LIMIT_LARGEST:-420}" --model gpt-13b --layers "${LAYERS:-57}" \
      --ckpt --batch 1 --steps 3 --warmup 0 --init-dtype bf16 --tier host+nvme --optim-frac 0 \
      --device-budget-gb "${DEVICE_GB:-60}" --host-budget-gb "${HOST_GB:-110}" --master-tier nvme \
      --swap-dir "${SWAP:-/tmp/swap}" --modes zero2-offload
    df -h "${SWAP:-/tmp/swap}" | tail -1 ;;
  esac
done
log done
