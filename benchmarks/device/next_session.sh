#!/usr/bin/env bash
# Next GPU session, first call (nvidia-h200 or -x2; the two-GPU tests skip on one GPU):
# build; the GPU tests not yet run on a GPU (pinned huge-page blocks, automatic
# placement on CUDA, chunk memory taking torch's cache) and the offload
# and ZeRO GPU tests again; then issue 5's open measurements, each run its own process
# pinned to 16 cores:
#  - automatic placement against static full offload ("where full offload fits, auto fits
#    too and is at least as fast"): 1.3B (everything comes back to the GPU) and 6.7B
#    (part of it does);
#  - ZeRO-3 with every parameter shard in host memory (param_frac=1) at 1.3B;
#  - ZeRO-3 with chunks kept gathered from forward to backward (keep_gathered_bytes);
# and the 16-core AdamW on the engine's huge-page host memory beside torch on the same
# memory (issue 2); the two file I/O backends on the box's disk. Written 2026-11-30 and not
# yet run on a GPU: masters on NVMe (test_offload_gpu.py), stage-3 auto placement moving
# parameter shards back (test_auto_placement_on_gpu, 1p3b_zero3_auto), the io_uring backend.
# Two calls of about 6 and 9 minutes (PART below). Then: the 12B with part of the host update
# moved to the GPU (OffloadConfig.visit_frac; 1,206 tok/s with none on 2026-11-30):
#   SECTIONS="gpt12b gpt12b-visit" bash benchmarks/device/issue5_offload.sh
# PART=tests (build, C++ and pytest GPU tests, the I/O backends) and PART=bench (the
# rest) split it into two calls under the device's 10-minute limit; unset: both.
source "$(dirname "$0")/setup.sh"
build comm zero pipeline offload
if [ "${PART:-all}" != bench ]; then
log ctest-memory-gpu  # the pinned huge-page blocks (written 2026-11-30, not yet run on a GPU)
{ cmake -S . -B /tmp/ctest-gpu -G Ninja -DMEGALITH_TESTS=ON -DMEGALITH_CUDA=ON \
    -DCMAKE_BUILD_TYPE=Release > /dev/null && timeout 300 cmake --build /tmp/ctest-gpu \
    --target test_memory_resources_gpu > /dev/null && /tmp/ctest-gpu/core/tests/test_memory_resources_gpu; } \
  2>&1 | tail -12 | tee "$OUT/ctest_memory_gpu.txt"
log pytest-gpu
timeout ${PYTEST_LIMIT:-240} python3 -m pytest -p no:cacheprovider -q -rs --timeout 200 \
  tests/test_offload_auto.py::test_auto_placement_on_gpu tests/test_offload_gpu.py \
  tests/test_zero_gpu.py tests/test_zero_visit.py tests/test_io_backend.py 2>&1 | tail -25 \
  | tee "$OUT/pytest_gpu.txt"
log io-backends  # the engine's two I/O backends on this machine's disk (written 2026-11-30)
timeout 120 python3 benchmarks/io/bench_io.py --dir /tmp --gib 2 --rounds 3 --backend both \
  --request-mib 8,64 --inflight 4 --machine "H200 box" 2>&1 | tail -20 | tee "$OUT/io_backends.txt"
fi
[ "${PART:-all}" = tests ] && { log done; exit 0; }
cd "$(dirname "$0")/../.."
bench 1p3b_static 120 --batch 16 --steps 6 --warmup 2 --modes zero2-offload
bench 1p3b_auto 120 --batch 16 --steps 6 --warmup 2 --modes zero2-offload --placement auto
bench 1p3b_zero3_params_host 150 --batch 16 --steps 6 --warmup 2 --modes zero3-offload --param-frac 1
# stage 3 auto: the warm-up as the line above (shards and states on the host), then back
bench 1p3b_zero3_auto 150 --batch 16 --steps 6 --warmup 2 --modes zero3-offload --placement auto
bench 1p3b_zero3 120 --batch 16 --steps 6 --warmup 2 --modes zero3
bench 1p3b_zero3_keep 120 --batch 16 --steps 6 --warmup 2 --modes zero3 --keep-gathered-gb 3
bench 6p7b_auto 240 --model gpt-6.7b --ckpt --batch 8 --steps 3 --warmup 2 --modes zero2-offload \
  --placement auto
log host-adam
timeout 150 taskset -c "${CORES:-0-15}" python3 benchmarks/optim/host_adam_large.py --threads 16 \
  --out "$OUT/host_adam.jsonl" 2>&1 | tail -10
log done
