#!/usr/bin/env bash
# Every GPU test, in one call of under 8 minutes on nvidia-h200 (or -x2, where the two-GPU
# tests run too; on one GPU they skip):
#   build   megalith-core (the root, MEGALITH_CUDA=ON) and ./packages/{comm,zero,pipeline,
#           offload,megalith}, pip --no-build-isolation --no-deps (setup.sh's build);
#   pytest  the test files that hold GPU tests ($GPU_TESTS below: the tests marked with
#           tests/support/gpu.py's `gpu` skip mark, `pytest.mark.gpu`, or skipping without
#           CUDA GPUs), with -rs so every skip says why;
#   ctest   the C++ tests of the labels gpu and nccl (core/tests/CMakeLists.txt), built for
#           this GPU alone (CUDAARCHS, default 90) in the background while pytest runs.
# SECTIONS="pytest ctest" (default both) picks the parts; the build always runs.
# GPU_TESTS=tests runs the whole suite instead (PYTEST_LIMIT, default 330 s, bounds pytest;
# the whole suite may need more than one 10-minute call allows).
# Logs under $OUT: machine.txt, build.txt, pytest_gpu.txt, cpp_build.txt, ctest_gpu.txt and
# summary.txt (one line per part with its exit status and seconds). Copy them to
# benchmarks/device/logs/<date>_<machine>_gpu_tests.txt (see benchmarks/README.md).
source "$(dirname "$0")/setup.sh"
SECTIONS=${SECTIONS:-pytest ctest}
GPU_TESTS=${GPU_TESTS:-"tests/engine/test_memory.py tests/engine/test_errors.py
  tests/engine/test_io_backend.py tests/optim/test_cuda.py tests/comm/test_gpu.py
  tests/comm/test_engine_gpu.py tests/comm/test_engine.py tests/zero/test_gpu.py
  tests/zero/test_visit.py tests/offload/test_gpu.py
  tests/offload/test_auto.py::test_auto_placement_on_gpu tests/pipeline/test_gpu.py
  tests/cli/test_env.py tests/colossalai/test_gpu.py tests/optim/test_lean_states.py
  tests/autoparallel/test_auto_plugin.py::test_auto_on_one_gpu_matches_plain_torch_in_bf16
  tests/checkpoint/test_async_general_pinned.py
"}
START=$SECONDS
FAILED=""
summary() {
  echo "$1 rc=$2 ${3}s" | tee -a "$OUT/summary.txt"
  [ "$2" = 0 ] || FAILED="$FAILED $1"
}
machine_info
build
summary build 0 $((SECONDS - START))

CT=$SCRATCH/ctest-gpu
if has_section ctest; then
  log "ctest build (background)"
  ct0=$SECONDS
  (
    cmake -S . -B "$CT" -G Ninja -DMEGALITH_TESTS=ON -DMEGALITH_CUDA=ON -DMEGALITH_PYTHON=OFF \
      -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES="$CUDAARCHS" &&
      nice -n 10 timeout "${CTEST_BUILD_LIMIT:-300}" cmake --build "$CT" --target \
        test_cuda_optim test_cuda_lean_states test_cuda_grad_check test_memory_resources_gpu \
        test_comm_nccl
  ) > "$OUT/cpp_build.txt" 2>&1 &
  CT_BUILD=$!
fi

if has_section pytest; then
  log "pytest (GPU tests, $NGPU GPUs)"
  t0=$SECONDS
  # shellcheck disable=SC2086
  timeout "${PYTEST_LIMIT:-330}" python3 -m pytest -p no:cacheprovider -q -rs --timeout 240 \
    --durations 10 $GPU_TESTS > "$OUT/pytest_gpu.txt" 2>&1
  rc=$?
  tail -30 "$OUT/pytest_gpu.txt"
  summary pytest $rc $((SECONDS - t0))
fi

if has_section ctest; then
  log "ctest (labels gpu, nccl)"
  wait "$CT_BUILD"
  rc=$?
  if [ $rc -ne 0 ]; then
    tail -30 "$OUT/cpp_build.txt"
    summary ctest-build $rc $((SECONDS - ct0))
  else
    timeout "${CTEST_LIMIT:-120}" ctest --test-dir "$CT" -L 'gpu|nccl' --no-tests=error \
      --output-on-failure --timeout 100 > "$OUT/ctest_gpu.txt" 2>&1
    rc=$?
    tail -25 "$OUT/ctest_gpu.txt"
    summary ctest $rc $((SECONDS - ct0))
  fi
fi
summary all "$([ -z "$FAILED" ] && echo 0 || echo 1)" $((SECONDS - START))
[ -z "$FAILED" ] || { log "failed:$FAILED"; exit 1; }
log done
