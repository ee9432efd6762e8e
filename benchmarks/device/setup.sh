#!/usr/bin/env bash
# Sourced by the device scripts: environment (NVLink multicast off, as the device README
# asks), $OUT, log(), machine_info, build (the floor dist at the root with CUDA, then the
# packages), the sections loop helper and the runners bench/run1/torchrun_n.
# Every script runs from the repository root (a clean snapshot of HEAD, see
# benchmarks/README.md) and writes what it measured under $OUT.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.." || exit 1
export PYTHONUNBUFFERED=1 CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-${TMPDIR:-/tmp}/out}
# scratch on the device machine (swap files, checkpoints, the C++ test build)
SCRATCH=${SCRATCH:-${TMPDIR:-/tmp}}
mkdir -p "$OUT"
log() { echo "=== $* ($(date +%T))"; }
# the dists, floor first: megalith-core (the root) and then these packages
PACKAGES=${PACKAGES:-comm zero pipeline offload megalith}
NGPU=$(nvidia-smi -L 2>/dev/null | wc -l)
machine_info() {
  {
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
    nvidia-smi topo -m 2>/dev/null | head -5
    lscpu | grep -E 'Model name|^CPU\(s\)'
    free -g | head -2
    python3 -c 'import torch; print("torch", torch.__version__, torch.version.cuda, "nccl", torch.cuda.nccl.version())'
    echo "commit $(git rev-parse --short HEAD 2>/dev/null || echo '(snapshot)')"
  } > "$OUT/machine.txt" 2>&1
  cat "$OUT/machine.txt"
}
# build [PACKAGE...]: pip install the root dist with CUDA and ./packages/PACKAGE for each
# (default: $PACKAGES, every dist). A warm machine keeps what an earlier call installed:
# once per machine unless REBUILD=1. The kernels are built for the lent GPUs alone
# (CUDAARCHS, default 90: every lent kind is an H200), a third of the default build's
# nvcc work; CUDAARCHS="80-real;90-real;90-virtual" builds what a plain install builds.
export CUDAARCHS=${CUDAARCHS:-90}
build() {
  local marker=$SCRATCH/megalith_built
  if [ -z "${REBUILD:-}" ] && [ -e "$marker" ]; then log "build (kept from an earlier call)"; else
    log build
    local pkgs=() p
    for p in ${@:-$PACKAGES}; do pkgs+=("./packages/$p"); done
    MEGALITH_CUDA=ON python3 -m pip install --no-build-isolation --no-deps -q . "${pkgs[@]}" \
      > "$OUT/build.txt" 2>&1 || { tail -40 "$OUT/build.txt"; exit 1; }
    touch "$marker"
  fi
  python3 -c 'import megalith_core; print(megalith_core.build_info())' 2>&1 | tail -1
  MEGALITH_NCCL_PATH=$(python3 -c 'import nvidia, os; print(os.path.join(list(nvidia.__path__)[0], "nccl", "lib"))')
  export MEGALITH_NCCL_PATH
}
# has_section NAME: whether $SECTIONS (space separated; the script's default when unset)
# names it
has_section() { [[ " $SECTIONS " == *" $1 "* ]]; }
# one process on one GPU, launcher warnings dropped
run1() { timeout "${RUN1_LIMIT:-120}" python3 -m torch.distributed.run --nproc_per_node 1 "$@" 2>&1 | grep -v "^W"; }
# torchrun_n N SCRIPT ARGS...: N processes, $LIMIT seconds, launcher warnings dropped
torchrun_n() { local n=$1; shift; timeout "${LIMIT:-300}" python3 -m torch.distributed.run --nproc_per_node "$n" "$@" 2>&1 | grep -v "^W"; }
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
