#!/usr/bin/env bash
# The H200 box's AutoParallel profile, the async-checkpoint stall and the exit soak, in the
# sections SECTIONS names (default "calibrate async13"):
#   calibrate  `megalith calibrate` on the one GPU ($OUT/h200_measured.json, calibrate.txt);
#              the built-in autoparallel/profiles/h200.json adds published NVLink figures to it
#   async13    benchmarks/checkpoint/async_save.py, gpt-1.3b under ZeRO-2, 2 async and 1 sync
#              saves to the local disk ($OUT/async_1p3b.md)
#   async67    the same for gpt-6.7b with masters and states on the host (--offload) and the
#              discard sink (its checkpoint is larger than the disk) ($OUT/async_6p7b.md)
#   soak       tools/exit_stress.py: short 2-rank CPU `megalith train` runs, SOAK_RUNS (300) of
#              them SOAK_JOBS (7) at a time, within SOAK_LIMIT s ($OUT/soak.jsonl, soak.txt)
source "$(dirname "$0")/setup.sh"
SECTIONS=${SECTIONS:-calibrate async13}
machine_info
build
if has_section calibrate; then
  log calibrate
  timeout 200 python3 -m megalith calibrate --out "$OUT/h200_measured.json" 2>&1 | tee "$OUT/calibrate.txt"
fi
if has_section async13; then
  log "async save gpt-1.3b"
  RUN1_LIMIT=300 run1 benchmarks/checkpoint/async_save.py --model gpt-1.3b --plugin zero2 \
    --rounds 2 --dir "$SCRATCH/ckpt-bench" --out "$OUT/async_1p3b.md" | tail -25
  rm -rf "$SCRATCH/ckpt-bench"
fi
if has_section async67; then
  log "async save gpt-6.7b, host offload, discard sink"
  RUN1_LIMIT=${ASYNC67_LIMIT:-300} run1 benchmarks/checkpoint/async_save.py --model gpt-6.7b \
    --plugin zero2 --offload --sink discard --rounds 2 --dir "$SCRATCH/ckpt-bench" \
    --out "$OUT/async_6p7b.md" | tail -25
  rm -rf "$SCRATCH/ckpt-bench"
fi
if has_section soak; then
  log "exit soak"
  timeout "${SOAK_LIMIT:-500}" python3 tools/exit_stress.py --runs "${SOAK_RUNS:-300}" \
    --jobs "${SOAK_JOBS:-7}" --steps 2 --timeout 120 --out "$OUT/soak.jsonl" 2>&1 | tail -30 | tee "$OUT/soak.txt"
  python3 -c "
import json, sys
rows = [json.loads(l) for l in open('$OUT/soak.jsonl')]
print(f'soak: {len(rows)} runs finished, {sum(r[\"abort\"] for r in rows)} aborts, '
      f'{sum(not r[\"clean\"] for r in rows)} unclean, median {sorted(r[\"seconds\"] for r in rows)[len(rows)//2]} s')
" | tee -a "$OUT/soak.txt"
fi
log done
