#!/usr/bin/env bash
# Issue 8 on whatever GPUs the machine has (nvidia-h200-x2 and up): engine NCCL collectives
# beside torch's (run 1), the ~7B Llama in bf16 under ZeRO-2, ZeRO-3, FSDP2 and tp with and
# without sequence parallelism on every GPU (runs 2 and 5; one JSON line per run in
# $OUT/llama7b.jsonl), and a checkpoint saved on N GPUs resumed on N/2 (run 4).
source "$(dirname "$0")/setup.sh"
build comm zero pipeline offload
N=$(nvidia-smi -L | wc -l)
log "collectives on $N GPUs"
for op in all_reduce all_gather reduce_scatter; do
  timeout 150 python3 -m torch.distributed.run --nproc_per_node "$N" benchmarks/comm/$op.py \
    --out "$OUT/comm_${op}_w$N.jsonl" 2>&1 | grep -v "^W" | tail -8
done
log "llama-7b on $N GPUs"
for m in ${MODES:-zero2 fsdp2 zero3 tp tp-sp}; do
  log "$m"
  timeout ${RUN_LIMIT:-300} python3 -m torch.distributed.run --nproc_per_node "$N" \
    benchmarks/multi_gpu/zero_vs_fsdp2.py --mode "$m" --model "${MODEL:-llama-7b}" \
    --batch "${BATCH:-4}" --seq 2048 --ckpt --out "$OUT/llama7b.jsonl" 2>&1 | grep -v "^W" | tail -3
done
log "checkpoint saved on $N GPUs, resumed on $((N / 2))"
if [ "$N" -ge 2 ]; then
  for phase in save resume; do
    n=$([ "$phase" = save ] && echo "$N" || echo $((N / 2)))
    timeout 300 python3 -m torch.distributed.run --nproc_per_node "$n" \
      benchmarks/multi_gpu/reshard_resume.py --phase "$phase" --dir /tmp/reshard \
      2>&1 | grep -v "^W" | tail -2 | tee -a "$OUT/reshard.jsonl"
  done
fi
log done
