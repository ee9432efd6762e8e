#!/usr/bin/env bash
# One call on the lent H200 machine for issue 2: build with CUDA, run the C++
# GPU tests and the optimizer test suite, then the GPU and host optimizer
# benchmarks. Run from a clean snapshot of HEAD (see benchmarks/README.md):
#   git archive HEAD | tar -x -C .snap   (.snap is git-ignored and carried)
# Results go to $OUT (the device tool brings them back).
set -uo pipefail
export PYTHONUNBUFFERED=1 CMAKE_BUILD_PARALLEL_LEVEL=16
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
log() { echo "=== $* ($(date +%T))"; }
{
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
  lscpu | grep -E 'Model name|^CPU\(s\)'
  python3 -c 'import torch; print("torch", torch.__version__, torch.version.cuda)'
} > "$OUT/machine.txt" 2>&1
cat "$OUT/machine.txt"

log build
MEGALITH_CUDA=ON python3 -m pip install --no-build-isolation --no-deps -q . > "$OUT/build.txt" 2>&1 || { tail -40 "$OUT/build.txt"; exit 1; }
python3 -c 'import megalith; print(megalith.build_info())'

log ctest
cmake -S . -B build/cpp -G Ninja -DMEGALITH_CUDA=ON -DMEGALITH_TESTS=ON > /dev/null &&
  cmake --build build/cpp -j16 > "$OUT/cpp_build.txt" 2>&1 &&
  ctest --test-dir build/cpp --output-on-failure --timeout 300 2>&1 | tail -40 | tee "$OUT/ctest.txt"

log pytest
timeout 900 python3 -m pytest -q -p no:cacheprovider ${PYTEST_ARGS:-tests} 2>&1 | tail -40 | tee "$OUT/pytest.txt"

log gpu_adam
timeout 900 python3 benchmarks/optim/gpu_adam.py --out "$OUT/gpu_adam.jsonl" 2>&1 | tee "$OUT/gpu_adam.txt"

log host_adam
timeout 600 python3 benchmarks/optim/host_adam_large.py --n 1e9 --threads 16 --steps 5 --out "$OUT/host_adam.jsonl" 2>&1 | tee "$OUT/host_adam.txt"
log done
