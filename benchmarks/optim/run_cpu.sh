#!/usr/bin/env bash
# CPU optimizer step: megalith against the peers (torch, DeepSpeed, ColossalAI)
# and the Adam-shaped bandwidth ceiling, measured in the same run (issue 2).
#
#   bash benchmarks/optim/run_cpu.sh                    # full run, ~30 min on the 2-core VM
#   ROUNDS=1 QUICK=1 bash benchmarks/optim/run_cpu.sh   # smoke test (2^22/2^23 params)
#   SUMMARY_ONLY=1 RAW=path bash benchmarks/optim/run_cpu.sh   # re-make the table from a raw log
#
# Peers are timed by the shared harness's own bench_opt.py in its own venvs
# under $WORK (default ${XDG_CACHE_HOME:-~/.cache}/megalith/cpubench; set WORK to the WORK of
# $MEGALITH_SHARED/bench/cpu/run_peers.sh to reuse the venvs it made);
# if they are missing, run_peers.sh is called once with ROUNDS=0 to create and
# check them (minutes: pip installs plus DeepSpeed/ColossalAI JIT builds).
# megalith is timed by bench_cpu_step.py in $MEGALITH_PYTHON (the dev venv).
# Every config runs once per round, the start position rotated each round; the
# stream.c ceiling (adamw kernel) is measured inside the rounds too.
#
# Knobs: ROUNDS (3) QUICK (0) WARMUP (2) STEPS (5) WORK (see above)
#        PEERS ("torch-foreach torch-fused torch-fused+bf16 ds ds-bf16 cai cai-fp16grad")
#        MEGALITH_PYTHON (the python3 on PATH: the activated dev venv)
#        MEGALITH_SHARED (the peers' shared checkout, default ../shared beside this repository)
#        SHARED_CPU ($MEGALITH_SHARED/bench/cpu) MACHINE (cpu: the file names' machine)
#        RESULTS (benchmarks/results/optim_cpu) MAX_WAIT / MAX_WAIT_TOTAL (900 / 3600 s: waits for a quiet machine)
#        BUSY_MAX (0.15: quiet = no compiler running and CPUs at most this busy)
# Writes RESULTS/<date>_<machine>_raw.txt and RESULTS/<date>_<machine>.md
# (QUICK=1: <date>_<machine>_quick*, ignored by git).
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
MEGALITH_SHARED="${MEGALITH_SHARED:-$REPO/../shared}"
SHARED="${SHARED_CPU:-$MEGALITH_SHARED/bench/cpu}"
WORK="${WORK:-${XDG_CACHE_HOME:-$HOME/.cache}/megalith/cpubench}"
MACHINE="${MACHINE:-cpu}"
ROUNDS="${ROUNDS:-3}"
QUICK="${QUICK:-0}"
WARMUP="${WARMUP:-2}"
STEPS="${STEPS:-5}"
MPY="${MEGALITH_PYTHON:-$(command -v python3)}"
PY="${PYTHON:-python3}"
MAX_WAIT="${MAX_WAIT:-900}"
MAX_WAIT_TOTAL="${MAX_WAIT_TOTAL:-3600}"
read -r -a PEER_LIST <<< "${PEERS:-torch-foreach torch-fused torch-fused+bf16 ds ds-bf16 cai cai-fp16grad}"
RESULTS="${RESULTS:-$REPO/benchmarks/results/optim_cpu}"
SUMMARIZE="$HERE/summarize_cpu.py"

if [[ "${SUMMARY_ONLY:-0}" == 1 ]]; then exec "$PY" "$SUMMARIZE" "${RAW:?RAW=path of a raw log}"; fi

mkdir -p "$RESULTS" "$WORK/results"
DATE="$(date -u +%F)"
SUF=""; [[ $QUICK == 1 ]] && SUF="_quick"
NAME="${DATE}_${MACHINE}"
if [[ -e "$RESULTS/${NAME}${SUF}_raw.txt" ]]; then  # a second run on the same day keeps the first
  NAME="${NAME}_T$(date -u +%H%M)"
fi
RAW="$RESULTS/${NAME}${SUF}_raw.txt"
MD="$RESULTS/${NAME}${SUF}.md"

# the same environment the shared run_peers.sh gives the peers
export PIP_CACHE_DIR="$WORK/pipcache"
export TORCH_EXTENSIONS_DIR="$WORK/torch_ext"   # DeepSpeed's JIT-built kernel lives here
CLEAN=(env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE -u THP_MEM_ALLOC_ENABLE -u MEGALITH_SIMD -u MEGALITH_NUM_THREADS)
venv_of() { case "$1" in ds*) echo venv-ds;; cai*) echo venv-cai;; *) echo venv-torch;; esac; }
env_of() {
  case "$1" in
    ds*)  echo "DS_ACCELERATOR=cpu";;
    cai*) echo "HOME=$WORK/home FORCE_CUDA=1 CUDA_HOME=/usr/local/cuda TORCH_CUDA_ARCH_LIST=8.0 CPATH=$WORK/cai_shim";;
    *)    echo "";;
  esac
}

# ------------------------------------------------------------ peer venvs ----
peers_ready() {
  "$WORK/venv-torch/bin/python" -c "import torch" 2>/dev/null &&
  "$WORK/venv-ds/bin/python" -c "import deepspeed" 2>/dev/null &&
  "$WORK/venv-cai/bin/python" -W ignore -c "from colossalai.nn.optimizer import CPUAdam" 2>/dev/null &&
  [[ -f "$WORK/cai_shim/cublas_v2.h" ]]
}
if ! peers_ready; then
  echo "=== peer venvs missing under $WORK: running the shared run_peers.sh once (ROUNDS=0: install + check only)"
  echo "    log: $WORK/results/peer_setup.log"
  if ! ROUNDS=0 WORK="$WORK" PYTHON="$PY" bash "$SHARED/run_peers.sh" > "$WORK/results/peer_setup.log" 2>&1; then
    tail -20 "$WORK/results/peer_setup.log"; echo "peer setup failed" >&2; exit 1
  fi
  peers_ready || { echo "peer venvs still not importable; see $WORK/results/peer_setup.log" >&2; exit 1; }
  cat "$WORK/results/check.txt"
fi
"$MPY" -c "import megalith._engine" || { echo "megalith is not importable from $MPY" >&2; exit 1; }

# ------------------------------------------------------------- quiet box ----
# Timings are meaningless while anything else runs on this 2-core box. Before
# each config: wait while a compiler runs or the CPUs are more than BUSY_MAX
# busy over one second (nothing of ours runs then), at most MAX_WAIT seconds
# per config and MAX_WAIT_TOTAL in all; then it measures anyway and says so.
# The busy fraction seen last is appended to the config's line (busy=).
BUSY_RE="(^|[/ ])(cmake|ninja|cc1|cc1plus|nvcc|cicc)( |$)"  # as a program, not in --cmake-dir
BUSY_MAX="${BUSY_MAX:-0.15}"
cpu_busy() {  # fraction of all CPUs busy over one second
  local a b
  read -r -a a < /proc/stat; sleep 1; read -r -a b < /proc/stat
  awk -v a="${a[*]:1:8}" -v b="${b[*]:1:8}" 'BEGIN {
    split(a, x); split(b, y); for (i = 1; i <= 8; i++) { d = y[i] - x[i]; t += d; if (i == 4 || i == 5) idle += d }
    printf "%.2f", (t > 0 ? 1 - idle / t : 0) }'
}
top2() {  # the two heaviest processes / compilers, as a hint (no SIGPIPE under pipefail)
  if [[ $1 == cc ]]; then
    pgrep -af "$BUSY_RE" 2>/dev/null | awk 'NR <= 2 { printf "%s; ", substr($0, 1, 100) }' || true
  else
    top -bn1 -o %CPU -c -w 200 2>/dev/null | awk 'NR > 7 && NR <= 9 {
      c = ""; for (i = 12; i <= NF; i++) c = c " " $i; printf "%s%%%s; ", $9, substr(c, 1, 90) }' || true
  fi
}
BUSY=0
WAITED_TOTAL=0
wait_quiet() {
  local waited=0 why limit=$(( MAX_WAIT < MAX_WAIT_TOTAL - WAITED_TOTAL ? MAX_WAIT : MAX_WAIT_TOTAL - WAITED_TOTAL ))
  while :; do
    BUSY=$(cpu_busy)
    why=""
    if pgrep -f "$BUSY_RE" > /dev/null; then why="compiling: $(top2 cc)"
    elif awk -v b="$BUSY" -v m="$BUSY_MAX" 'BEGIN { exit !(b > m) }'; then
      why="CPUs ${BUSY} busy: $(top2 cpu)"
    fi
    [[ -z $why ]] && return 0
    (( limit > 0 )) || return 0  # waiting budget spent: busy= on the line tells
    if (( waited == 0 && limit > 0 )); then echo "... busy, waiting (up to ${limit}s): $why"; fi
    if (( waited >= limit )); then
      echo "# WARNING round=$ROUND: still busy after ${waited}s, measuring anyway: $why" | tee -a "$RAW"
      return 0
    fi
    sleep 20; waited=$(( waited + 21 )); WAITED_TOTAL=$(( WAITED_TOTAL + 21 ))
  done
}

# --------------------------------------------------------------- machine ----
gcc -O3 -march=native -fno-math-errno -fopenmp "$SHARED/stream.c" -o "$WORK/stream" -lm
pyver() { "$WORK/$1/bin/python" -c "import importlib.metadata as m; print(' '.join(f'{p}=={m.version(p)}' for p in '$2'.split()))" 2>/dev/null || echo "?"; }
{
  echo "# date: $(date -u +%F' '%T) UTC   host: $(hostname)   QUICK=$QUICK ROUNDS=$ROUNDS WARMUP=$WARMUP STEPS=$STEPS"
  lscpu | grep -E '^(Model name|CPU\(s\)|Thread|Core|L2|L3|NUMA node\(s\)|Hypervisor)' | sed 's/^/# /'
  echo "# SIMD flags: $(grep -o -w -E 'avx2|fma|f16c|avx512f|avx512bw|avx512vl|avx512_bf16|avx512_fp16|amx_bf16|amx_tile' /proc/cpuinfo | sort -u | tr '\n' ' ')"
  echo "# THP: $(cat /sys/kernel/mm/transparent_hugepage/enabled)   memory: $(free -g | awk '/^Mem/{print $2}') GiB   load: $(cut -d' ' -f1-3 /proc/loadavg)"
  echo "# gcc: $(gcc --version | head -1)   stream: gcc -O3 -march=native -fno-math-errno -fopenmp $SHARED/stream.c"
  echo "# megalith: $("$MPY" -c "import megalith._engine as e, torch; b = e.build_info(); print(f\"{b['version']} ({b['build_type']}, {b['cxx_compiler']} {b['cxx_flags']}, simd {b['simd_levels_compiled']}, best {b['simd_level_best']}) torch=={torch.__version__}\")")   repo: $(git -C "$REPO" rev-parse --short HEAD)$(git -C "$REPO" diff --quiet HEAD -- core python 2>/dev/null || echo '+dirty')"
  echo "# venv-torch: $(pyver venv-torch torch)   venv-ds: $(pyver venv-ds 'torch deepspeed')   venv-cai: $(pyver venv-cai 'torch colossalai')"
} | tee "$RAW"

# ---------------------------------------------------------------- checks ----
ROUND=0
echo "=== correctness checks (5 steps on 1e5 params vs torch.optim)"
OURS_ADAM=(megalith megalith-bf16grad+copy megalith-bf16grad+copy-skip megalith-fp16grad megalith-avx2 megalith-scalar)
"${CLEAN[@]}" MEGALITH_NUM_THREADS=2 "$MPY" "$HERE/bench_cpu_step.py" --check "${OURS_ADAM[@]}" megalith-sgd 2>&1 |
  grep -E '^CHECK|Error|FAILED' | tee -a "$RAW" || true
for impl in "${PEER_LIST[@]}" sgd-foreach; do  # also warms the peers' JIT caches
  "${CLEAN[@]}" OMP_NUM_THREADS=2 $(env_of "$impl") "$WORK/$(venv_of "$impl")/bin/python" "$SHARED/bench_opt.py" \
    --check "$impl" 2>&1 | grep -E '^CHECK|Error' | tee -a "$RAW" || true
done

# ------------------------------------------------------------- commands ----
run_opt() {  # impl log2n threads
  local impl=$1 n=$2 t=$3 out
  local -a cmd
  if [[ $impl == megalith* ]]; then
    cmd=("${CLEAN[@]}" MEGALITH_NUM_THREADS="$t" OMP_NUM_THREADS="$t" "$MPY" "$HERE/bench_cpu_step.py")
  else
    # shellcheck disable=SC2046  # env_of yields VAR=value words
    cmd=("${CLEAN[@]}" OMP_NUM_THREADS="$t" $(env_of "$impl") "$WORK/$(venv_of "$impl")/bin/python" "$SHARED/bench_opt.py")
  fi
  if out=$("${cmd[@]}" "$impl" "$n" "$t" "$WARMUP" "$STEPS" 2>&1); then
    echo "$out" | grep '^RESULT' | sed "s/\$/ pages=4k round=$ROUND busy=$BUSY/" | tee -a "$RAW"
  else
    echo "FAIL impl=$impl log2n=$n threads=$t pages=4k round=$ROUND :: $(echo "$out" | tail -2 | tr '\n' ' ')" | tee -a "$RAW"
  fi
}
run_stream() {  # threads: the Adam-shaped ceiling (stream.c, 4 KiB pages, 2^27 params)
  local t=$1
  "${CLEAN[@]}" OMP_NUM_THREADS="$t" "$WORK/stream" 3 0 27 | grep -v '^#' |
    awk -v t="$t" -v R="$ROUND" -v B="$BUSY" '{printf "STREAM kernel=%s threads=%s huge=0 rep=%s round=%s gbs=%s busy=%s\n",$1,t,$2,R,$3,B}' |
    tee -a "$RAW"
}

# ---------------------------------------------------------------- matrix ----
if [[ $QUICK == 1 ]]; then N26=22; N28=23; else N26=26; N28=28; fi
CONFIGS=("stream 1" "stream 2")
for i in "${OURS_ADAM[@]}" megalith-sgd "${PEER_LIST[@]}" sgd-foreach; do CONFIGS+=("opt $i $N26 2"); done
for i in "${OURS_ADAM[@]}" megalith-sgd "${PEER_LIST[@]}" sgd-foreach; do CONFIGS+=("opt $i $N26 1"); done
for i in "${OURS_ADAM[@]}" "${PEER_LIST[@]}"; do CONFIGS+=("opt $i $N28 2"); done

NC=${#CONFIGS[@]}
T0=$(date +%s)
for ((ROUND = 1; ROUND <= ROUNDS; ROUND++)); do
  echo "=== round $ROUND / $ROUNDS  ($(date -u +%T), $NC configs)"
  echo "# round=$ROUND start $(date -u +%T) load: $(cut -d' ' -f1-3 /proc/loadavg)" >> "$RAW"
  off=$(( (ROUND - 1) * NC / ROUNDS ))
  for ((k = 0; k < NC; k++)); do
    read -r -a c <<< "${CONFIGS[$(( (k + off) % NC ))]}"
    wait_quiet
    if [[ ${c[0]} == stream ]]; then run_stream "${c[1]}"; else run_opt "${c[@]:1}"; fi
  done
done
echo "# done $(date -u +%T) after $(( $(date +%s) - T0 )) s of rounds; load: $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$RAW"
"$PY" "$SUMMARIZE" "$RAW" > "$MD"
cat "$MD"
echo "raw: $RAW"
echo "table: $MD"
