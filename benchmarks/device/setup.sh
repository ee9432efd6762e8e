#!/usr/bin/env bash
# Sourced by the device scripts: environment (NVLink multicast off, as the device README
# asks), $OUT, log(), and build PACKAGES... (megalith with CUDA and the named packages).
set -uo pipefail
export PYTHONUNBUFFERED=1 CMAKE_BUILD_PARALLEL_LEVEL=$(nproc)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
log() { echo "=== $* ($(date +%T))"; }
build() {
  # a warm machine keeps what an earlier call installed: build once per machine
  if [ -z "${REBUILD:-}" ] && [ -e /tmp/megalith_built ]; then log "build (kept from an earlier call)"; else
  log build
  local pkgs=() p
  for p in "$@"; do pkgs+=("./packages/$p"); done
  MEGALITH_CUDA=ON python3 -m pip install --no-build-isolation --no-deps -q . "${pkgs[@]}" \
    > "$OUT/build.txt" 2>&1 || { tail -40 "$OUT/build.txt"; exit 1; }
  touch /tmp/megalith_built; fi
  MEGALITH_NCCL_PATH=$(python3 -c 'import nvidia, os; print(os.path.join(list(nvidia.__path__)[0], "nccl", "lib"))')
  export MEGALITH_NCCL_PATH
}
# one process on one GPU, launcher warnings dropped
run1() { timeout "${RUN1_LIMIT:-120}" python3 -m torch.distributed.run --nproc_per_node 1 "$@" 2>&1 | grep -v "^W"; }
# one benchmarks/zero/gpu_gpt.py run in its own process, pinned to $CORES (default 0-15,
# the core count of the one-GPU H200 box): bench NAME LIMIT ARGS...; writes $OUT/NAME.md
# and $OUT/NAME.log and prints the run's row (or the log's tail when it failed)
bench() {
  local name=$1 limit=$2; shift 2
  log "$name"
  timeout "$limit" taskset -c "${CORES:-0-15}" python3 -m torch.distributed.run --nproc_per_node 1 \
    benchmarks/zero/gpu_gpt.py --out "$OUT/$name.md" "$@" > "$OUT/$name.log" 2>&1
  grep "'mode'" "$OUT/$name.log" | cut -c1-600 || grep -v "^W" "$OUT/$name.log" | tail -8
}
