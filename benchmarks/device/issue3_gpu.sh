#!/usr/bin/env bash
# One call on a lent H200 machine (one or two GPUs) for issues 2 and 3: build
# with CUDA, the C++ tests (cpu, gpu, nccl labels), the whole pytest suite, the
# engine collectives benchmark at world size 1 (and 2 when two GPUs are
# present), and the host AdamW benchmark. Run from a clean snapshot of HEAD:
#   rm -rf .snap && mkdir .snap && git archive HEAD | tar -x -C .snap
set -uo pipefail
export PYTHONUNBUFFERED=1 CMAKE_BUILD_PARALLEL_LEVEL=32
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
log() { echo "=== $* ($(date +%T))"; }
NGPU=$(nvidia-smi -L | wc -l)
{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  nvidia-smi topo -m 2>/dev/null | head -5
  lscpu | grep -E 'Model name|^CPU\(s\)'
  python3 -c 'import torch; print("torch", torch.__version__, torch.version.cuda, "nccl", torch.cuda.nccl.version())'
} > "$OUT/machine.txt" 2>&1
cat "$OUT/machine.txt"

log build
MEGALITH_CUDA=ON python3 -m pip install --no-build-isolation --no-deps -q . ./packages/comm > "$OUT/build.txt" 2>&1 || { tail -40 "$OUT/build.txt"; exit 1; }
python3 -c 'import megalith; print(megalith.build_info())'
NCCL_LIB=$(python3 -c 'import nvidia, os; print(os.path.join(list(nvidia.__path__)[0], "nccl", "lib"))')
export MEGALITH_NCCL_PATH=$NCCL_LIB

log ctest
cmake -S . -B build/cpp -G Ninja -DMEGALITH_CUDA=ON -DMEGALITH_TESTS=ON > /dev/null &&
  cmake --build build/cpp > "$OUT/cpp_build.txt" 2>&1 &&
  ctest --test-dir build/cpp --output-on-failure --timeout 300 2>&1 | tail -25 | tee "$OUT/ctest.txt"

log pytest
timeout 900 python3 -m pytest -q -p no:cacheprovider -x -rs tests 2>&1 | tail -30 | tee "$OUT/pytest.txt"
timeout 300 python3 -m pytest -q -p no:cacheprovider -v tests/test_comm_engine_gpu.py 2>&1 | grep -E "PASS|FAIL|SKIP|raised|Error" | tail -40 | tee "$OUT/pytest_comm_gpu.txt"

log comm-bench
for c in all_reduce all_gather reduce_scatter broadcast all_to_all; do
  timeout 120 python3 benchmarks/comm/$c.py -e 64M --out "$OUT/comm_w1.jsonl" 2>&1 | tail -14
done | tee "$OUT/comm_w1.txt"
if [ "$NGPU" -ge 2 ]; then
  for c in all_reduce all_gather reduce_scatter; do
    timeout 180 python3 -m torch.distributed.run --nproc_per_node "$NGPU" benchmarks/comm/$c.py -e 256M --out "$OUT/comm_w$NGPU.jsonl" 2>&1 | grep -v "^W" | tail -20
  done | tee "$OUT/comm_w$NGPU.txt"
fi

log host_adam
timeout 300 python3 benchmarks/optim/host_adam_large.py --n 1e9 --threads 16 --steps 5 --out "$OUT/host_adam.jsonl" 2>&1 | tee "$OUT/host_adam.txt"
log done
