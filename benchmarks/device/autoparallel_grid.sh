#!/usr/bin/env bash
# Issue 18's H200 grid: benchmarks/autoparallel/grid.py --preset h200 (1.3B-12.2B on one
# GPU: ZeRO stage, offload fraction, micro-batch, checkpointing; GRID_LIMIT s, default 480),
# measured only ($OUT/<date>_h200_grid.jsonl, grid.txt); compare.py puts the cost model
# beside it on any machine. With TAIL=async67 and time left (CALL_LIMIT, default 580 s, is
# the whole call's), the 6.7B async-save stall of calibrate_async_soak.sh runs after it.
source "$(dirname "$0")/setup.sh"
machine_info
build
log "autoparallel grid"
timeout "${GRID_LIMIT:-480}" python3 benchmarks/autoparallel/grid.py --device cuda --preset h200 \
  --out "$OUT/$(date -u +%F)_h200_grid.jsonl" 2>&1 | tee "$OUT/grid.txt"
left=$(( ${CALL_LIMIT:-580} - SECONDS - 15 ))
if [[ "${TAIL:-}" == async67 && $left -gt 120 ]]; then
  log "async save gpt-6.7b, host offload, discard sink ($left s)"
  RUN1_LIMIT=$left run1 benchmarks/checkpoint/async_save.py --model gpt-6.7b --plugin zero2 \
    --offload --sink discard --rounds 2 --out "$OUT/async_6p7b.md" 2>&1 | tee "$OUT/async_6p7b.txt" | grep -E "^row|\|" | tail -12
fi
log done
