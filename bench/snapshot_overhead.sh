#!/usr/bin/env bash
# What in-memory snapshots cost an uninterrupted job (issue 15: "snapshot overhead <= 1 % of step
# time at one snapshot per 10 steps"): kill_loop.sh's job (the 2-worker MultiWorkerMirrored MLP,
# batch 64, backups every 50 steps, under `dtrain launch --nproc-per-node 2`; JOB=lm or gpt: a
# char GPT, bench/lib.sh kill_loop_job_args) without kills, with --snapshot-every 0 and
# --snapshot-every S, interleaved round by round.
# With DTRAIN_A=<another dtrain binary> (e.g. a build of main) each round also runs that binary
# both ways, so two builds' snapshot overheads are compared on the same machine state.
# Per run: wall seconds and CPU seconds (user + system of the launcher and its workers, from
# /usr/bin/time), and of those the launcher's own (launcher_cpu: the total less the workers', each
# worker under a /usr/bin/time of its own); the median epoch time of the workers' progress lines
# (epoch_s, --verbose 2, the first epoch skipped: training alone, without start-up, data loading
# and the end); the load average at its start; and (in_thread%) the share of its training time
# that a worker spent taking snapshots on its training thread, as fit reports it (the largest
# worker's). Prints every run, then per binary the median overhead of snapshots in wall, CPU and
# epoch time (against the same binary without snapshots).
# Usage: bench/snapshot_overhead.sh [epochs=5] [snapshot_every=10] [rounds=3] (after
# scripts/build.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/lib.sh  # fortunes_corpus
epochs="${1:-5}"
every="${2:-10}"
rounds="${3:-3}"
b="$(pwd)/${BUILD_DIR:-build}/dtrain"
[[ -x "$b" ]] || { echo "missing $b: run scripts/build.sh first" >&2; exit 1; }
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 OMP_WAIT_POLICY=passive
tmp=$(mktemp -d)
trap "rm -rf \"\$tmp\"" EXIT
job="${JOB:-mlp}"
kill_loop_job_args "$job" "$tmp"
binaries=(B)
declare -A path=([B]="$b")
if [[ -n "${DTRAIN_A:-}" ]]; then
  binaries=(A B)
  path[A]="$DTRAIN_A"
fi

# run BINARY SNAPSHOT_EVERY: prints "wall cpu load in_thread launcher_cpu epoch" (in_thread: the
# largest share of its training time a worker spent taking snapshots, as it reports at the end of
# fit; "-" when none were taken)
run() {
  local dir="$tmp/run" load
  rm -rf "$dir"
  mkdir -p "$dir"
  load=$(cut -d' ' -f1 /proc/loadavg)
  /usr/bin/time -o "$dir/time" -f "%e %U %S" "${path[$1]}" launch --nproc-per-node 2 \
    --max-restarts 0 --snapshot-every "$2" --event-log "$dir/events.jsonl" -- \
    /usr/bin/time -a -o "$dir/workers" -f "%U %S" \
    "${path[$1]}" fit --strategy multi-worker --epochs "$epochs" "${job_args[@]}" --seed 0 \
    --verbose 2 --checkpoint-dir "$dir/ckpt" --checkpoint-every 50 > "$dir/log" 2>&1 ||
    { echo "run $1 --snapshot-every $2 failed:" >&2; tail -20 "$dir/log" >&2; exit 1; }
  local in_thread
  in_thread=$({ grep -oE 'on the training thread: [0-9.]+%' "$dir/log" || true; } |
    { grep -oE '[0-9.]+' || true; } | sort -g | tail -1)
  local workers epoch
  workers=$(awk '{ s += $1 + $2 } END { printf "%.2f", s }' "$dir/workers")
  epoch=$(dtrain_epoch "$dir/log")
  awk -v load="$load" -v t="${in_thread:--}" -v w="$workers" -v e="$epoch" \
    '{ printf "%.2f %.2f %s %s %.2f %.3f\n", $1, $2 + $3, load, t, $2 + $3 - w, e }' "$dir/time"
}

echo "job: $job, $epochs epochs, snapshots every $every steps, $rounds rounds; $(getconf _NPROCESSORS_ONLN) CPUs"
printf '%-6s %-6s %9s %8s %8s %13s %8s %6s %10s\n' round binary snapshots wall_s cpu_s \
  launcher_cpu_s epoch_s load in_thread%
results="$tmp/results"
for ((r = 1; r <= rounds; r++)); do
  for bin in "${binaries[@]}"; do
    for s in 0 "$every"; do
      read -r wall cpu load in_thread launcher epoch < <(run "$bin" "$s")
      printf '%-6s %-6s %9s %8s %8s %13s %8s %6s %10s\n' "$r" "$bin" "$s" "$wall" "$cpu" \
        "$launcher" "$epoch" "$load" "$in_thread"
      echo "$r $bin $s $wall $cpu $epoch" >> "$results"
    done
  done
done
echo "load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
for bin in "${binaries[@]}"; do
  # Per round: overhead = with / without - 1; the median over the rounds.
  overheads=$(awk -v bin="$bin" -v every="$every" '
    $2 == bin && $3 == 0 { w0[$1] = $4; c0[$1] = $5; e0[$1] = $6 }
    $2 == bin && $3 == every { w1[$1] = $4; c1[$1] = $5; e1[$1] = $6 }
    END { for (r = 1; r <= 1000; r++) if ((r in w0) && (r in w1)) printf "%.1f %.1f %.1f\n", 100 * (w1[r] / w0[r] - 1), 100 * (c1[r] / c0[r] - 1), 100 * (e1[r] / e0[r] - 1) }' "$results")
  n=$(echo "$overheads" | wc -l)
  m=$(((n + 1) / 2))
  wall=$(echo "$overheads" | awk '{ print $1 }' | sort -g | sed -n "${m}p")
  cpu=$(echo "$overheads" | awk '{ print $2 }' | sort -g | sed -n "${m}p")
  epoch=$(echo "$overheads" | awk '{ print $3 }' | sort -g | sed -n "${m}p")
  echo "$bin: snapshots every $every steps cost ${wall}% wall, ${cpu}% CPU, ${epoch}% epoch time (median of $n rounds; wall/CPU/epoch % per round: $(echo "$overheads" | tr ' \n' '/ ' ))"
done
