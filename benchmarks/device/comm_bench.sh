#!/usr/bin/env bash
# The engine's NCCL collectives beside torch.distributed (benchmarks/comm/, both in the same
# process): results in benchmarks/results/comm_gpu/. SECTIONS picks the parts (default
# "world1 worldn"):
#   world1   all five collectives at world size 1, up to 64 MiB ($OUT/comm_w1.*);
#   worldn   all_reduce, all_gather and reduce_scatter on every GPU (nvidia-h200-x2 and up),
#            one jsonl per op ($OUT/comm_OP_wN.jsonl; COMM_MAX, e.g. 256M, sets -e);
#   latency  all_reduce up to 1 MiB on every GPU with NCCL blocking and non-blocking
#            (MEGALITH_NCCL_BLOCKING=1, 0) ($OUT/allreduce_wN_blocking*.jsonl, latency.txt).
source "$(dirname "$0")/setup.sh"
SECTIONS=${SECTIONS:-world1 worldn}
build
N=$NGPU
if has_section world1; then
  log "collectives at world 1"
  for c in all_reduce all_gather reduce_scatter broadcast all_to_all; do
    timeout 120 python3 benchmarks/comm/$c.py -e 64M --out "$OUT/comm_w1.jsonl" 2>&1 | tail -14
  done | tee "$OUT/comm_w1.txt"
fi
if has_section worldn; then
  if [ "$N" -ge 2 ]; then
    log "collectives on $N GPUs"
    for op in all_reduce all_gather reduce_scatter; do
      LIMIT=180 torchrun_n "$N" benchmarks/comm/$op.py ${COMM_MAX:+-e "$COMM_MAX"} \
        --out "$OUT/comm_${op}_w$N.jsonl" | tail -8
    done | tee "$OUT/comm_w$N.txt"
  else log "worldn: needs 2 GPUs or more, $N here"; fi
fi
if has_section latency; then
  log "all_reduce latency on $N GPUs, NCCL blocking and not"
  for mode in 1 0; do
    echo "MEGALITH_NCCL_BLOCKING=$mode"
    MEGALITH_NCCL_BLOCKING=$mode LIMIT=120 torchrun_n "$N" benchmarks/comm/all_reduce.py -e 1M \
      --out "$OUT/allreduce_w${N}_blocking$mode.jsonl" | tail -20
  done | tee "$OUT/latency.txt"
fi
log done
