#!/usr/bin/env bash
# Next GPU session, first call (nvidia-h200-x2; on one GPU the two-GPU parts skip): build,
# the GPU tests of the 2026-11-30 code (the pipelined host update and parameter offload,
# p2p links and pipelines, ZeRO's fused-norm path), the pipeline schedules on both GPUs
# (issues 6 and 8), then the 1.3B offload runs pinned to 16 cores (issue 5). Second call:
# SECTIONS="gpt6p7b gpt12b" issue5_offload.sh, and the host AdamW figure (issue 2):
#   taskset -c 0-15 python3 benchmarks/optim/host_adam_large.py --threads 16
# Third: SECTIONS=largest issue5_offload.sh (about 6 minutes: NVMe traffic per step).
# On nvidia-h200-x2, issue 8's ZeRO against FSDP2 with the step overlapped:
#   SECTIONS=llama MODES="zero2 zero2-overlap fsdp2 zero3-early" issue8_multi_gpu.sh
source "$(dirname "$0")/setup.sh"
REBUILD=1 build comm zero pipeline offload
log pytest-gpu
timeout ${PYTEST_LIMIT:-170} python3 -m pytest -p no:cacheprovider -q -rs -x --timeout 160 \
  tests/test_offload_gpu.py tests/test_pipeline_gpu.py tests/test_comm_gpu.py tests/test_zero_gpu.py \
  2>&1 | tail -15 | tee "$OUT/pytest_gpu.txt"
SECTIONS=pipeline bash "$(dirname "$0")/issue8_multi_gpu.sh"
SECTIONS=gpt1p3b MODES_1P3B="${MODES_1P3B:-torch zero2-offload zero2-offload-after}" \
  bash "$(dirname "$0")/issue5_offload.sh"
log done
