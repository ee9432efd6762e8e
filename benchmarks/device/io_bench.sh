#!/usr/bin/env bash
# The engine's two file I/O backends (a pool of pread/pwrite threads, io_uring) beside dd
# on the lent machine's disk, where the NVMe tier of megalith_offload writes: results in
# benchmarks/results/io/. IO_DIR (default $SCRATCH) is the directory measured.
source "$(dirname "$0")/setup.sh"
build
log io-backends
timeout 150 python3 benchmarks/io/bench_io.py --dir "${IO_DIR:-$SCRATCH}" --gib 2 --rounds 3 \
  --backend both --request-mib 8,64 --inflight 4 --machine "${MACHINE:-H200 box}" 2>&1 \
  | tail -20 | tee "$OUT/io_backends.txt"
log done
