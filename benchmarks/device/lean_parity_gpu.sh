#!/usr/bin/env bash
# Issue 20, deliverable 2 on the H200: loss parity of adamw's lean states at 1.3B.
# `megalith train --model "${MODEL:-gpt-1.3b}" --precision bf16 --plugin ddp` on one GPU, the same
# data (the built-in corpus), schedule and seed with --optim-state-dtype fp32, bf16 and
# int8 (HybridAdam's CUDA kernels: the fused fp32 one and the lean one), STEPS (300)
# steps of BATCH x SEQ (8 x 1024) tokens, lr 3e-4, clipping at 1.0; then
# benchmarks/optim/lean_state_parity.py compares the curves (table + png). Each run is
# capped by --max-time (MAX_TIME, 110 s): the comparison stops at the last step all
# reached. Checkpoints are removed after each run (the disk holds ~60 GB).
# Results under $OUT: lean_parity.md, lean_parity.png, <run>.log, <run>_metrics.jsonl.
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
    --save-every 100000 --max-time "${MAX_TIME:-110}" --optim-state-dtype "$dtype" \
    --name "$name" --out "$RUNS" --seed 0 > "$OUT/$name.log" 2>&1
  echo "rc=$? $(tail -c 400 "$OUT/$name.log" | tr '\r' '\n' | tail -3)"
  cp "$RUNS/$name/metrics.jsonl" "$OUT/${name}_metrics.jsonl" 2>/dev/null
  find "$RUNS/$name" -mindepth 1 -maxdepth 1 ! -name '*.jsonl' ! -name '*.json' \
    ! -name '*.txt' ! -name '*.md' -exec rm -rf {} +
done
log compare
python3 benchmarks/optim/lean_state_parity.py "$RUNS" --names "$(IFS=,; echo "${names[*]}")" \
  --title "# Lean Adam states at 1.3B on the H200: loss parity" \
  --out "$OUT/lean_parity.md" --png "$OUT/lean_parity.png" 2>&1 | tail -30
log done
