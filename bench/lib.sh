# Shared shell of the side-by-side benchmarks (bench/mlp_epoch.sh, bench/cnn_epoch.sh,
# bench/cnn_parallel.sh): sourced, not run. After `bench_setup`, the caller is in the repository
# root, runs with one thread per BLAS/OpenMP pool, and has a scratch directory "$tmp" that is
# removed on exit.

# bench_setup: cd to the repository root, one thread per pool, OpenBLAS picks its own kernels
# (unless KEEP_OPENBLAS_ENV=1), a scratch directory, and the dirty pages of earlier runs flushed.
bench_setup() {
  cd "$(dirname "${BASH_SOURCE[0]}")/.."
  # One thread each, and no OpenMP/BLAS pools competing for the two cores.
  export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1
  # Some machines here force OpenBLAS's Haswell kernels (OPENBLAS_CORETYPE) for old builds' sake;
  # Debian's OpenBLAS 0.3.21 picks its own (Cooperlake on the reference machine). Both programs
  # use the same OpenBLAS, so the comparison is fair either way; KEEP_OPENBLAS_ENV=1 keeps it.
  if [[ -z "${KEEP_OPENBLAS_ENV:-}" ]]; then unset OPENBLAS_CORETYPE OPENBLAS_L2_SIZE; fi
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  # Flush what earlier runs (a checkpoint benchmark, a build) left dirty, so that the kernel's
  # writeback does not compete for the two cores while this measures.
  sync
  sleep 1
}

# need_binary PATH: exits with a hint when a build output is missing.
need_binary() {
  [[ -x "$1" ]] || { echo "missing $1: run scripts/build.sh first" >&2; exit 1; }
}

# get KEY FILE: the value of the "KEY value" line of FILE.
get() { awk -v k="$1" '$1 == k { print $2 }' "$2"; }

# median VALUES...: the median (the lower middle one for an even count).
median() { printf '%s\n' "$@" | sort -g | awk '{ a[NR] = $1 } END { print a[int((NR + 1) / 2)] }'; }

# dtrain_epoch LOG: median epoch seconds from `dtrain fit --verbose 2` lines ("... XXXms/epoch"),
# skipping the first epoch when there are more.
dtrain_epoch() {
  local all
  all=$(grep -oE '[0-9]+ms/epoch' "$1" | sed 's/ms\/epoch//')
  if [[ $(wc -l <<< "$all") -gt 1 ]]; then all=$(tail -n +2 <<< "$all"); fi
  sort -g <<< "$all" | awk '{ a[NR] = $1 } END { printf "%.4f", a[int((NR + 1) / 2)] / 1000 }'
}

# max_rss_mib FILE: the largest "peak_rss_kib N" line of FILE (one per process, from
# /usr/bin/time -f 'peak_rss_kib %M'), in MiB.
max_rss_mib() {
  grep -oE 'peak_rss_kib [0-9]+' "$1" | awk '$2 > m { m = $2 } END { printf "%.1f", m / 1024 }'
}

# print_machine: the CPU, the load average and OpenBLAS's kernels and build (from
# bench_gemm_floor, when built), so that every report says where it was measured.
print_machine() {
  echo "CPU: $(lscpu | sed -n 's/^Model name:[[:space:]]*//p' | head -1) ($(getconf _NPROCESSORS_ONLN) CPUs); load average: $(cut -d' ' -f1-3 /proc/loadavg)"
  local floor="${BUILD_DIR:-build}/bench/bench_gemm_floor"
  if [[ -x "$floor" ]]; then
    "$floor" 1 > "$tmp/floor"
    echo "OpenBLAS: kernels $(get openblas_core "$tmp/floor"); $(sed -n 's/^openblas_config //p' "$tmp/floor")"
  fi
  echo "dtrain flushes denormals: ${DTRAIN_FLUSH_DENORMALS:-1} (DTRAIN_FLUSH_DENORMALS)"
}

# speedup DTRAIN PYTORCH PYTORCH_FTZ TARGET: PyTorch's faster time over dtrain's.
speedup() {
  awk -v d="$1" -v t="$2" -v f="$3" -v target="$4" 'BEGIN {
    best = t < f ? t : f; which = t < f ? "default" : "flush_denormal"
    printf "speedup (faster pytorch (%s) / dtrain): %.2fx  (target >= %s)\n", which, best / d, target }'
}

# row LABEL KEY: "LABEL dtrain pytorch pytorch+ftz" from the files "$last_d", "$last_t" and
# "$last_f" (the caller sets them); header: the column names.
row() {
  printf '%-44s %10s %10s %12s\n' "$1" "$(get "$2" "$last_d")" "$(get "$2" "$last_t")" "$(get "$2" "$last_f")"
}
header() { printf '%-44s %10s %10s %12s\n' "metric" "dtrain" "pytorch" "pytorch+ftz"; }

# side_by_side BIN TORCH_SCRIPT EPOCHS ROUNDS: runs dtrain's BIN and TORCH_SCRIPT (as it comes,
# then with flush_denormal) alternately for ROUNDS rounds, so that machine noise hits all alike.
# Sets d, t, f (median epoch seconds of dtrain, PyTorch, PyTorch + flush_denormal), the arrays
# d_epochs, t_epochs, f_epochs (per round) and last_d, last_t, last_f (the last round's outputs).
side_by_side() {
  local bin="$1" script="$2" epochs="$3" rounds="$4" r
  d_epochs=() t_epochs=() f_epochs=()
  for r in $(seq "$rounds"); do
    "$bin" "$epochs" 1 > "$tmp/dtrain.$r"
    /usr/bin/python3 "$script" "$epochs" 1 0 > "$tmp/torch.$r"
    /usr/bin/python3 "$script" "$epochs" 1 1 > "$tmp/torchftz.$r"
    d_epochs+=("$(get epoch_seconds_median "$tmp/dtrain.$r")")
    t_epochs+=("$(get epoch_seconds_median "$tmp/torch.$r")")
    f_epochs+=("$(get epoch_seconds_median "$tmp/torchftz.$r")")
  done
  d=$(median "${d_epochs[@]}")
  t=$(median "${t_epochs[@]}")
  f=$(median "${f_epochs[@]}")
  last_d="$tmp/dtrain.$rounds" last_t="$tmp/torch.$rounds" last_f="$tmp/torchftz.$rounds"
}

# fortunes_corpus FILE: the English fortunes (the text files, not the .dat/.u8 indexes) in name
# order, as data/fortunes.h reads them: the LM benchmarks' corpus.
fortunes_corpus() {
  find /usr/share/games/fortunes -maxdepth 1 -type f ! -name '*.dat' ! -name '*.u8' -print0 |
    sort -z | xargs -0 cat > "$1"
}

# char_gpt_args TMP CONTEXT LAYERS D_MODEL BATCH LEARNING_RATE: sets job_args, a char GPT's
# `dtrain fit` arguments (4 heads, AdamW, global_clipnorm 1.0, 1% held out) on the fortunes text in
# TMP, STEPS steps per epoch (default 100; STEPS=0: each epoch one pass over the text's windows).
char_gpt_args() {
  fortunes_corpus "$1/fortunes.txt"
  job_args=(--arch gpt --corpus "$1/fortunes.txt" --context "$2" --layers "$3" --d-model "$4"
    --heads 4 --batch-size "$5" --optimizer adamw --learning-rate "$6" --global-clipnorm 1.0
    --validation-split 0.01)
  if [[ ${STEPS:-100} != 0 ]]; then job_args+=(--steps-per-epoch "${STEPS:-100}"); fi
}

# kill_loop_job_args JOB TMP: sets job_args, the `dtrain fit` arguments of the kill-loop job
# (bench/kill_loop.sh, bench/snapshot_overhead.sh): mlp (the Fashion-MNIST MLP, batch 64), lm
# (a small char GPT: 2 blocks, d_model 64, context 64, global batch 16, learning rate 1e-3;
# STEPS=0 keeps a long job from running out of data) or gpt (issue 13's char GPT: 4 blocks,
# d_model 128, context 128, global batch 32, learning rate 3e-4).
kill_loop_job_args() {
  case "$1" in
    mlp) job_args=(--batch-size 64) ;;
    lm) char_gpt_args "$2" 64 2 64 16 1e-3 ;;
    gpt) char_gpt_args "$2" 128 4 128 32 3e-4 ;;
    *) echo "JOB must be mlp, lm or gpt, not '$1'" >&2; exit 2 ;;
  esac
}

# The kill loops' own polling, without starting a process: on a 2-vCPU VM each fork and exec
# (a `sleep`, a `pgrep` that scans /proc, a grep pipeline) costs milliseconds of CPU taken from
# the job being measured, and the uninterrupted runs they are compared with pay none of it.
# (Session 16 measured the old polling at 0.15 CPU-s per period on the Zen 5 VM.)

# pause SECONDS: sleeps in `read`'s timeout on a FIFO nobody writes to (opened once per shell).
pause() {
  if [[ -z "${pause_fd:-}" ]]; then
    local fifo
    fifo=$(mktemp -u)
    mkfifo "$fifo"
    exec {pause_fd}<> "$fifo"
    rm -f "$fifo"
  fi
  read -r -t "$1" -u "$pause_fd" _ || true
}

# children_of PID: sets `children` to PID's child processes (from /proc, no process started).
children_of() {
  children=()
  read -r -a children 2> /dev/null < "/proc/$1/task/$1/children" || true
}

# runs_script PID NAME: whether an argument of PID's command line ends in NAME.
runs_script() {
  local args=() a
  mapfile -d "" args 2> /dev/null < "/proc/$1/cmdline" || return 1
  for a in "${args[@]}"; do [[ $a == *"$2" ]] && return 0; done
  return 1
}
