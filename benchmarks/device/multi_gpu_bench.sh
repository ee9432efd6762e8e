#!/usr/bin/env bash
# Several GPUs of one host (nvidia-h200-x2 and up), every GPU the machine has: the ~7B Llama
# in bf16 under ZeRO-2, ZeRO-3, FSDP2 and tp with and without sequence parallelism (runs 2
# and 5 of issue 8; one JSON line per run in $OUT/llama7b.jsonl; `compute` is the floor:
# forward and backward alone), engine NCCL collectives beside torch's (run 1, comm_bench.sh's
# worldn), a checkpoint saved on N GPUs resumed on N/2 (run 4), the pipeline schedules on
# every GPU (run 3), and on 4 GPUs or more HybridParallelPlugin's tp 2 x pp 2 x dp layout.
# Results: benchmarks/results/multi_gpu/ (and pipeline/, comm_gpu/). SECTIONS picks and
# orders the parts (default "llama hybrid comm reshard pipeline"), MODES the llama runs
# (PROFILE=1: one more step of each under torch.profiler, $OUT/profile); a call that must
# stay inside the device's 10 minutes does a few of them.
source "$(dirname "$0")/setup.sh"
build
N=$NGPU
for section in ${SECTIONS:-llama hybrid comm reshard pipeline}; do
  case $section in
  comm)  # run 1: comm_bench.sh's worldn section (default sizes)
    SECTIONS=worldn bash benchmarks/device/comm_bench.sh ;;
  llama)
    for m in ${MODES:-compute zero2 zero2-overlap fsdp2 zero3 zero3-early tp tp-sp}; do
      log "llama: $m on $N GPUs"
      LIMIT=${RUN_LIMIT:-300} torchrun_n "$N" benchmarks/multi_gpu/zero_vs_fsdp2.py --mode "$m" \
        --model "${MODEL:-llama-7b}" --batch "${BATCH:-4}" --seq 2048 --ckpt \
        ${PROFILE:+--profile "$OUT/profile"} --out "$OUT/llama7b.jsonl" | tail -3
    done ;;
  reshard)
    log "checkpoint saved on $N GPUs, resumed on $((N / 2))"
    for phase in save resume; do
      n=$([ "$phase" = save ] && echo "$N" || echo $((N / 2)))
      LIMIT=300 torchrun_n "$n" benchmarks/multi_gpu/reshard_resume.py --phase "$phase" \
        --dir "$SCRATCH/reshard" | tail -2 | tee -a "$OUT/reshard.jsonl"
    done ;;
  hybrid)  # HybridParallelPlugin tp 2 x pp 2 x dp (the rest) on 4 or more GPUs (run 5)
    [ "$N" -ge 4 ] || { log "hybrid: needs 4 GPUs or more, $N here"; continue; }
    log "llama: tp 2 x pp 2 x dp $((N / 4)) on $N GPUs"
    LIMIT=${RUN_LIMIT:-300} torchrun_n "$N" benchmarks/multi_gpu/zero_vs_fsdp2.py --mode hybrid \
      --tp 2 --pp 2 --microbatches 4 --model "${MODEL:-llama-7b}" --batch "${HYBRID_BATCH:-8}" \
      --seq 2048 --ckpt --out "$OUT/llama7b.jsonl" | tail -3 ;;
  pipeline)
    log "pipeline schedules on $N GPUs"
    LIMIT=300 torchrun_n "$N" benchmarks/multi_gpu/pipeline_gpu.py --out "$OUT/pipeline.jsonl" | tail -30 ;;
  *) log "unknown section $section" ;;
  esac
done
log done
