#!/usr/bin/env bash
# Goodput under repeated failures (issue 15): the 2-worker MultiWorkerMirrored Fashion-MNIST MLP
# (batch 64, backups every 50 steps) under `dtrain launch --max-restarts 100`, one random worker
# SIGKILLed every P seconds, side by side: today's disk path (--snapshot-every 0: each restart
# reads the newest backup) and the memory path (--snapshot-every S: each restart takes the
# snapshot its launcher holds), both restarting every worker (--on-failure restart-all), and
# survivors (--on-failure survivors: only the killed worker restarts, the other rolls back to the
# agreed snapshot in its own process), and spares (survivors with --spares 1: a standby worker,
# data loaded and model built, takes over the killed rank instead of a new process; each spare
# is forked by the spares' fork server, --spare-start fork; the kills pick workers only, never
# the standby spare or the server), the same with --spare-start exec (each spare a process of its
# own that loads and builds, as before the fork server); and PyTorch DDP on the same job under torchrun
# --max_restarts with torch.save every 50 steps (bench/torchrun_kill_loop.sh; NO_TORCH=1 skips
# it), its goodput against its own uninterrupted run. Goodput = uninterrupted wall time / wall time with kills;
# recovery_s = mean of the launcher's recovery_seconds (failure detected -> first step after it;
# an upper bound: the launcher sees steps at its 250 ms monitor period). For survivors and spares
# the phases follow, exact (CLOCK_MONOTONIC, reported by the newcomer that received its state
# from a survivor): mean seconds after the failure's detection to the spare's assignment, its
# collectives connected (broadcast begun), the state received, restored, and its first step.
# JOB=lm runs the same modes on a small char-level GPT on the fortunes text (2 blocks, d_model 64,
# 4 heads, context 64, global batch 16, AdamW, global_clipnorm 1.0, STEPS steps per epoch,
# default 100; accuracy = the final validation accuracy), torchrun's rows the same GPT's
# (bench/torch_elastic.py lm).
# The second uninterrupted row takes snapshots every S steps: its wall time against the first is
# the snapshots' overhead (one round: compare only when the difference is above the noise).
# Usage: [MODES=disk,...] bench/kill_loop.sh [epochs=5] [period_s=1.5] [snapshot_every=10]
# [max_kills=0: no cap]
# (after scripts/build.sh). On a loaded machine, where a restart of every worker can take longer
# than the period (the job then never gets past it), cap the kills to compare the cost per failure.
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/lib.sh  # fortunes_corpus
epochs="${1:-5}"
period="${2:-1.5}"
every="${3:-10}"
max_kills="${4:-0}"
dtrain="$(pwd)/${BUILD_DIR:-build}/dtrain"
[[ -x "$dtrain" ]] || { echo "missing $dtrain: run scripts/build.sh first" >&2; exit 1; }
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
tmp=$(mktemp -d)
trap "${KEEP_TMP:+:} rm -rf \"\$tmp\"" EXIT
job="${JOB:-mlp}"
kill_loop_job_args "$job" "$tmp"

# workers_of LAUNCHER EVENTS: sets `workers` to the launcher's children that are workers: not a
# spare standing by (started, never taken over), nor the spares' fork server. Builtins only (see
# bench/lib.sh).
workers_of() {
  local launcher=$1 events=$2 lines=() line p
  local -A standby=() taken=()
  [[ -r $events ]] && mapfile -t lines < "$events"
  for line in "${lines[@]}"; do
    [[ $line =~ \"kind\":\"spare_(started|fork_server|takeover|lost)\" ]] || continue
    local kind=${BASH_REMATCH[1]}
    [[ $line =~ \"pid\":([0-9]+) ]] || continue
    case $kind in
      started | fork_server) standby[${BASH_REMATCH[1]}]=1 ;;
      *) taken[${BASH_REMATCH[1]}]=1 ;;
    esac
  done
  children_of "$launcher"
  workers=()
  for p in "${children[@]}"; do
    [[ -n ${standby[$p]:-} && -z ${taken[$p]:-} ]] || workers+=("$p")
  done
}

# run NAME SNAPSHOT_EVERY KILL(0|1) [ON_FAILURE [SPARES [SPARE_START]]]: prints "seconds kills
# accuracy lost_steps recovery_s cpu_s" (cpu_s: the CPU time of the launcher and every process it
# waited for: workers, spares, the spares' fork server; each run is a subshell of its own)
run() {
  local name=$1 snap=$2 kills_on=$3 mode=${4:-restart-all} spares=${5:-0} spare_start=${6:-fork}
  local dir="$tmp/$1"
  mkdir -p "$dir"
  local start end
  start=$(date +%s.%N)
  DTRAIN_STEP_TIMES="$dir/steps" "$dtrain" launch --nproc-per-node 2 --max-restarts 100 --grace-period 1 \
    --snapshot-every "$snap" --on-failure "$mode" --spares "$spares" --spare-start "$spare_start" \
    --event-log "$dir/events.jsonl" -- \
    "$dtrain" fit --strategy multi-worker --epochs "$epochs" "${job_args[@]}" --seed 0 \
    --verbose 2 --checkpoint-dir "$dir/ckpt" --checkpoint-every 50 --resume > "$dir/log" 2>&1 &
  local launcher=$! kills=0
  if [[ $kills_on == 1 ]]; then
    while kill -0 "$launcher" 2> /dev/null && ((max_kills == 0 || kills < max_kills)); do
      pause "$period"
      workers_of "$launcher" "$dir/events.jsonl"
      ((${#workers[@]} > 0)) || continue
      local victim=${workers[RANDOM % ${#workers[@]}]}
      kill -9 "$victim" 2> /dev/null && kills=$((kills + 1)) && echo "$victim $EPOCHREALTIME" >> "$dir/kills"
    done
  fi
  wait "$launcher"
  end=$(date +%s.%N)
  local acc lost
  acc=$({ grep -oE 'test_accuracy: [0-9.]+' "$dir/log" || true; } | tail -1 | awk '{ print $2 }')
  lost=$({ grep -o '"lost_steps":[0-9]*' "$dir/events.jsonl" || true; } | cut -d: -f2 |
    awk '{ s += $1 } END { print s + 0 }')
  local recovery
  recovery=$({ grep '"kind":"recovered"' "$dir/events.jsonl" || true; } |
    { grep -oE '"recovery_seconds":[0-9.e+-]+' || true; } | cut -d: -f2 |
    awk '{ s += $1; n++ } END { if (n) printf "%.3f", s / n; else print "-" }')
  local cpu
  times > "$dir/times"  # in this shell: a pipeline's subshell would have no children
  cpu=$(tail -1 "$dir/times" | awk '{ s = 0; for (i = 1; i <= 2; i++) { split($i, a, /[ms]/); s += a[1] * 60 + a[2] } printf "%.2f", s }')
  local inrun="- -"
  if [[ -s $dir/kills && -s $dir/steps ]]; then
    read -r n median _ _ < <(python3 bench/failure_cost.py "$dir/steps" "$dir/kills")
    inrun="$median $n"
  fi
  echo "$(echo "$end - $start" | bc) $kills ${acc:-?} $lost $recovery $cpu $inrun"
}

read -r t0 _ a0 _ _ c0 _ < <(run clean 0 0)
read -r t0s _ _ _ _ c0s _ < <(run clean_snapshots "$every" 0)
# MODES (comma-separated: disk,memory,survivors,spares,spares_exec; default all) picks the
# modes to run; the uninterrupted rows always run.
want() { [[ -z "${MODES:-}" || ",$MODES," == *",$1,"* ]]; }
rows=()
if want disk; then
  read -r t k a l r c m n < <(run disk 0 1)
  rows+=("disk (today, backups every 50)|$t|$k|$l|$r|$a|$c|$c0|$m|$n")
fi
if want memory; then
  read -r t k a l r c m n < <(run memory "$every" 1)
  rows+=("memory (snapshots every $every)|$t|$k|$l|$r|$a|$c|$c0s|$m|$n")
fi
if want survivors; then
  read -r t k a l r c m n < <(run survivors "$every" 1 survivors)
  rows+=("survivors (snapshots every $every)|$t|$k|$l|$r|$a|$c|$c0s|$m|$n")
fi
if want spares; then
  read -r t k a l r c m n < <(run spares "$every" 1 survivors 1)
  rows+=("spares (survivors + --spares 1)|$t|$k|$l|$r|$a|$c|$c0s|$m|$n")
fi
if want spares_exec; then
  read -r t k a l r c m n < <(run spares_exec "$every" 1 survivors 1 exec)
  rows+=("spares, --spare-start exec|$t|$k|$l|$r|$a|$c|$c0s|$m|$n")
fi
torch_rows=()
if [[ -z "${NO_TORCH:-}" && -x /usr/bin/torchrun ]]; then
  mapfile -t torch_rows < <(RAW=1 JOB=$job bench/torchrun_kill_loop.sh "$epochs" "$period" 50 "$max_kills")
fi
echo "job: $job; load average: $(cut -d' ' -f1-3 /proc/loadavg); $(getconf _NPROCESSORS_ONLN) CPUs; kill every ${period} s$(
  ((max_kills > 0)) && echo ", at most $max_kills kills")"
# cpu_s/failure: CPU time beyond the uninterrupted run's with snapshots (or without, for the disk
# row), per kill: what a failure costs in CPU, which a loaded machine does not change much.
# in_run_s/failure (kills measured): the median cost of a failure measured inside the run from
# the workers' step times (bench/failure_cost.py): on a VM whose speed drifts from one run to the
# next by more than the failures cost, steadier than s/failure, which sets the run's wall time
# against another run's.
printf '%-34s %8s %6s %9s %9s %10s %11s %9s %8s %13s %21s\n' mode wall_s kills goodput s/failure \
  lost_steps recovery_s accuracy cpu_s cpu_s/failure "in_run_s/failure (n)"
printf '%-34s %8.2f %6s %9s %9s %10s %11s %9s %8s %13s %21s\n' "uninterrupted" "$t0" 0 "100.0%" - - \
  - "$a0" "$c0" - -
printf '%-34s %8.2f %6s %9s %9s %10s %11s %9s %8s %13s %21s\n' "uninterrupted, snapshots every $every" \
  "$t0s" 0 "$(echo "100 * $t0 / $t0s" | bc -l | xargs printf '%.1f%%')" - - - - "$c0s" - -
for row in "${rows[@]}"; do
  IFS='|' read -r name t k l r a c base m n <<< "$row"
  printf '%-34s %8.2f %6s %8.1f%% %9.3f %10s %11s %9s %8s %13.3f %21s\n' "$name" "$t" "$k" \
    "$(echo "100 * $t0 / $t" | bc -l)" "$(echo "($t - $t0) / ($k + (${k} == 0))" | bc -l)" "$l" \
    "$r" "$a" "$c" "$(echo "($c - $base) / ($k + (${k} == 0))" | bc -l)" "$m ($n)"
done
# phases NAME: the mean (min-max) seconds after detection of each phase of the newcomers'
# snapshot_restore events with "source":"survivor".
phases() {
  local events="$tmp/$1/events.jsonl" line="" p
  for p in assigned started received restored first_step; do
    line+=$({ grep '"source":"survivor"' "$events" 2> /dev/null || true; } |
      { grep -oE "\"${p}_after_failure_s\":\"[0-9.e+-]+\"" || true; } |
      { grep -oE '[0-9.e+-]+"$' || true; } | tr -d '"' | awk -v p="$p" '{ s += $1; n++; if (n == 1 || $1 < lo) lo = $1; if ($1 > hi) hi = $1 }
        END { if (n) printf " %s %.3f (%.3f-%.3f)", p, s / n, lo, hi }')
  done
  local n
  n=$({ grep -c '"source":"survivor"' "$events" 2> /dev/null || true; })
  echo "$1 phases after detection, s, over ${n:-0} newcomers:${line:- none}"
}
for m in survivors spares spares_exec; do
  if want "$m"; then phases "$m"; fi
done
if ((${#torch_rows[@]} == 2)); then
  read -r tt0 _ ta0 _ _ _ _ <<< "${torch_rows[0]}"
  read -r tt tk ta tl _ tm tn <<< "${torch_rows[1]}"
  printf '%-34s %8.2f %6s %9s %9s %10s %11s %9s %8s %13s %21s\n' "torchrun uninterrupted" "$tt0" 0 \
    "100.0%" - - - "$ta0" - - -
  printf '%-34s %8.2f %6s %8.1f%% %9.3f %10s %11s %9s %8s %13s %21s\n' \
    "torchrun (torch.save every 50)" "$tt" "$tk" "$(echo "100 * $tt0 / $tt" | bc -l)" \
    "$(echo "($tt - $tt0) / ($tk + ($tk == 0))" | bc -l)" "$tl" - "$ta" - - "$tm ($tn)"
fi
