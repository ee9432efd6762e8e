#!/usr/bin/env bash
# 2026-11-30, nvidia-h200-x2, first call: build, the GPU tests of this session's code
# (offload host step, p2p and pipeline on two GPUs), the pipeline schedules on both GPUs
# (issues 6 and 8), then the 1.3B offload runs pinned to 16 cores (issue 5).
source "$(dirname "$0")/setup.sh"
REBUILD=1 build comm zero pipeline offload
log pytest-gpu
timeout ${PYTEST_LIMIT:-170} python3 -m pytest -p no:cacheprovider -q -rs -x --timeout 160 \
  tests/test_offload_gpu.py tests/test_pipeline_gpu.py tests/test_comm_gpu.py \
  2>&1 | tail -15 | tee "$OUT/pytest_gpu.txt"
SECTIONS=pipeline bash "$(dirname "$0")/issue8_multi_gpu.sh"
SECTIONS=gpt1p3b MODES_1P3B="${MODES_1P3B:-torch zero2-offload zero2-offload-after}" \
  bash "$(dirname "$0")/issue5_offload.sh"
log done
