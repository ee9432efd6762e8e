#!/usr/bin/env bash
# Issue 20, deliverable 2 on the H200: loss parity of adamw's lean states at 1.3B.
# `megalith train --model "${MODEL:-gpt-1.3b}" --precision bf16 --plugin ddp` on one GPU, the same
# data (the built-in corpus), schedule and seed with --optim-state-dtype fp32, bf16 and
# int8 (HybridAdam's CUDA kernels: the fused fp32 one and the lean one), STEPS (300)
# steps of BATCH x SEQ (8 x 1024) tokens, lr 3e-4, clipping at 1.0; then
# benchmarks/optim/lean_state_parity.py compares the curves (table + png). Each run is
# capped by --max-time (MAX_TIME, 110 s): the comparison stops at the last step all
# reached. No checkpoints (--save-every 0). PEER=1 (default) also times plain torch on the
# same model and batch (bf16 autocast over fp32 weights, fused AdamW) for the tok/s ratio.
# Results under $OUT (8 files at most come back): lean_parity.md, lean_parity.png,
# <run>_metrics.jsonl, peer.txt, all.log.
source "$(dirname "$0")/setup.sh"
build
machine_info > /dev/null
STEPS=${STEPS:-300}
RUNS=$SCRATCH/lean_runs
rm -rf "$RUNS"
names=()
for dtype in ${DTYPES:-fp32 bf16 int8}; do
  name=parity_$dtype
  names+=("$name")
  log "$name"
  timeout "${RUN_LIMIT:-170}" megalith train --model "${MODEL:-gpt-1.3b}" --precision bf16 --plugin ddp \
    --nproc "${NPROC:-1}" --steps "$STEPS" --batch-size "${BATCH:-8}" --seq-len "${SEQ:-1024}" \
    --lr 3e-4 --warmup 30 --max-norm 1.0 --eval-every 100 --eval-batches 4 \
    --save-every 0 --max-time "${MAX_TIME:-110}" --optim-state-dtype "$dtype" \
    --name "$name" --out "$RUNS" --seed 0 > "$SCRATCH/$name.log" 2>&1
  echo "rc=$? $(tr '\r' '\n' < "$SCRATCH/$name.log" | grep -E 'tokens/s|MFU|peak memory|steps ' | tr -s ' ')"
  tr '\r' '\n' < "$SCRATCH/$name.log" | grep -v '^\s*$' | tail -25 >> "$OUT/all.log"
  cp "$RUNS/$name/metrics.jsonl" "$OUT/${name}_metrics.jsonl" 2>/dev/null
  find "$RUNS/$name" -mindepth 1 -maxdepth 1 ! -name '*.jsonl' ! -name '*.json' \
    ! -name '*.txt' ! -name '*.md' -exec rm -rf {} +
done
if [ "${PEER:-1}" = 1 ]; then
  log "plain torch peer"
  timeout 120 python3 -c "
import sys; sys.path.insert(0, 'benchmarks/train')
from profile_gpu_step import plain_torch
s = plain_torch('${MODEL:-gpt-1.3b}', ${BATCH:-8}, ${SEQ:-1024}, 10)
print(f'plain torch: {s * 1e3:.0f} ms/step, {${BATCH:-8} * ${SEQ:-1024} / s:.0f} tok/s')
" 2>&1 | grep -v '^\[W' | tee "$OUT/peer.txt"
fi
log compare
python3 benchmarks/optim/lean_state_parity.py "$RUNS" --names "$(IFS=,; echo "${names[*]}")" \
  --title "# Lean Adam states at 1.3B on the H200: loss parity" \
  --out "$OUT/lean_parity.md" --png "$OUT/lean_parity.png" 2>&1 | tail -30
log done
