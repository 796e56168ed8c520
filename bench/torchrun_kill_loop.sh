#!/usr/bin/env bash
# PyTorch's side of bench/kill_loop.sh: the same 2-worker Fashion-MNIST MLP job (batch 64 = 2 x
# 32, Adam, one thread each) under `torchrun --standalone --nproc_per_node 2 --max_restarts 100
# --monitor_interval 0.1` (the agent polls its workers every 0.1 s; the default is 5 s) with
# torch.save checkpoints every EVERY steps (bench/torch_elastic.py; JOB=lm: kill_loop.sh's char
# GPT on the fortunes text, STEPS steps per epoch, default 100), once uninterrupted and
# once with one random worker SIGKILLed every P seconds. torchrun restarts every worker on any
# failure; each restart resumes from the newest checkpoint. `--redirects 1 --tee 1` (workers'
# stdout to files and the console) because Debian's torchrun (PyTorch 1.13 on Python 3.11) fails
# on its default "0": iterating the Std flag enum no longer yields the zero member on 3.11.
# Prints a table; with RAW=1, one line per run as kill_loop.sh's run does ("seconds kills
# accuracy lost_steps -": uninterrupted, then with kills), for kill_loop.sh to print beside its
# modes.
# Usage: bench/torchrun_kill_loop.sh [epochs=5] [period_s=1.5] [every=50] [max_kills=0]
# (Debian's /usr/bin/torchrun and python3-torch.)
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/lib.sh  # fortunes_corpus
epochs="${1:-5}"
period="${2:-1.5}"
every="${3:-50}"
max_kills="${4:-0}"
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
tmp=$(mktemp -d)
trap "${KEEP_TMP:+:} rm -rf \"\$tmp\"" EXIT
job="${JOB:-mlp}"
job_args=()
if [[ $job == lm ]]; then
  fortunes_corpus "$tmp/fortunes.txt"
  job_args=("${STEPS:-100}" "$tmp/fortunes.txt")
fi

# run NAME KILL(0|1): "seconds kills accuracy lost_steps -"
run() {
  local name=$1 kills_on=$2 dir="$tmp/$1"
  mkdir -p "$dir/ckpt"
  local start end
  start=$(date +%s.%N)
  /usr/bin/torchrun --standalone --nproc_per_node 2 --max_restarts 100 --monitor_interval 0.1 \
    --redirects 1 --tee 1 --log_dir "$dir/torchrun" bench/torch_elastic.py "$job" "$epochs" "$dir/ckpt" "$every" "$dir/progress" "${job_args[@]}" \
    > "$dir/log" 2>&1 &
  local agent=$! kills=0
  if [[ $kills_on == 1 ]]; then
    while kill -0 "$agent" 2> /dev/null && ((max_kills == 0 || kills < max_kills)); do
      pause "$period"
      children_of "$agent"
      workers=()
      for p in "${children[@]}"; do runs_script "$p" torch_elastic.py && workers+=("$p"); done
      ((${#workers[@]} > 0)) || continue
      local victim=${workers[RANDOM % ${#workers[@]}]}
      kill -9 "$victim" 2> /dev/null && kills=$((kills + 1)) && echo "$victim $EPOCHREALTIME" >> "$dir/kills"
    done
  fi
  wait "$agent"
  end=$(date +%s.%N)
  local acc lost
  acc=$({ grep -oE 'test_accuracy [0-9.]+' "$dir/log" || true; } | tail -1 | awk '{ print $2 }')
  # Each restart after the first start loses the steps between its resume point and the last
  # step the killed group reached.
  lost=$(awk '$1 == "at" { last = $2 } $1 == "resumed" { if (started) lost += last - $2; started = 1 }
    END { print lost + 0 }' "$dir/progress")
  # Each failure's cost inside the run (bench/failure_cost.py), from rank 0's step times.
  local inrun="- -"
  if [[ -s $dir/kills ]]; then
    awk '$1 == "at" && NF == 3 { print 0, $2, $3 }' "$dir/progress" > "$dir/steps"
    read -r n median _ _ < <(python3 bench/failure_cost.py "$dir/steps" "$dir/kills")
    inrun="$median $n"
  fi
  echo "$(echo "$end - $start" | bc) $kills ${acc:-?} $lost - $inrun"
}

read -r t0 _ a0 _ _ _ < <(run clean 0)
read -r tk k ak lk _ mk nk < <(run kills 1)
if [[ -n "${RAW:-}" ]]; then
  # For bench/kill_loop.sh, which prints the rows beside its own.
  echo "$t0 0 $a0 0 - - -"
  echo "$tk $k $ak $lk - $mk $nk"
else
  echo "load average: $(cut -d' ' -f1-3 /proc/loadavg); kill every ${period} s"
  printf '%-40s %8s %6s %9s %9s %10s %9s %21s\n' mode wall_s kills goodput s/failure lost_steps \
    accuracy "in_run_s/failure (n)"
  printf '%-40s %8.2f %6s %9s %9s %10s %9s %21s\n' "torchrun uninterrupted" "$t0" 0 "100.0%" - - \
    "$a0" -
  printf '%-40s %8.2f %6s %8.1f%% %9.3f %10s %9s %21s\n' "torchrun (torch.save every $every)" "$tk" \
    "$k" "$(echo "100 * $t0 / $tk" | bc -l)" "$(echo "($tk - $t0) / ($k + ($k == 0))" | bc -l)" \
    "$lk" "$ak" "$mk ($nk)"
fi
