#!/usr/bin/env bash
# nvidia-h200: after the one-rank stream fix in megalith_comm, the GPU tests that catch
# it and the per-step losses of ZeRO-2/3 again, then ZeRO-2/3 throughput.
source "$(dirname "$0")/setup.sh"
build comm zero pipeline offload
log pytest
timeout 200 python3 -m pytest -p no:cacheprovider -q -rs --timeout 180 tests/test_comm_gpu.py tests/test_zero_gpu.py 2>&1 | tail -15 | tee "$OUT/pytest_gpu.txt"
log losses
for m in zero2 zero3 zero3-noprefetch; do run1 benchmarks/zero/gpu_loss_check.py --mode $m | tail -2; done | tee "$OUT/losses.txt"
for m in zero3 zero2; do
  log "bench $m"
  run1 benchmarks/zero/gpu_gpt.py --batch 16 --modes $m --out "/tmp/gpt_$m.md" > "/tmp/gpt_$m.log"
  grep "'mode'" "/tmp/gpt_$m.log" || tail -5 "/tmp/gpt_$m.log"
done
log done
