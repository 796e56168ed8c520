#!/usr/bin/env bash
# The char GPT of bench/lm_tokens.sh (4 blocks, d_model 128, 4 heads, context 128, AdamW 3e-4,
# global_clipnorm 1.0) data-parallel on 1, 2 and 3 workers of this machine, one thread each,
# global batch BATCH (default 48, so that 1, 2 and 3 workers split it evenly): dtrain's
# MultiWorkerMirroredStrategy under `dtrain launch` — plain, with the all-reduce overlapped with
# backward (--overlap-gradients, 1 MiB buckets) and with sharded optimizer state
# (--shard-optimizer-state 1 and 2) — against PyTorch DDP, plain and with ZeroRedundancyOptimizer
# (bench/torch_lm_tokens.py with WORLD and ZERO). Reports the step time of each and the optimizer-slot bytes per worker
# (AdamW's two moments: dtrain's optimizer_slot_bytes of rank 0; PyTorch's largest rank), with the
# sharded figure as a multiple of 1/N of the unsharded one (target <= 1.05).
# Usage: bench/lm_scale.sh [steps_per_epoch] [workers...]   (default: 6 steps; 1 2 3 workers)
# Needs a build (scripts/build.sh), python3-torch and the fortunes (scripts/install_deps.sh).
set -euo pipefail
source "$(dirname "$0")/lib.sh"
bench_setup
steps="${1:-6}"
shift || true
workers=("$@")
[[ ${#workers[@]} -gt 0 ]] || workers=(1 2 3)
batch="${BATCH:-48}"
dtrain="${BUILD_DIR:-build}/dtrain"
need_binary "$dtrain"
corpus="$tmp/fortunes.txt"
fortunes_corpus "$corpus"
ctx=128 layers=4 d=128 heads=4

# run_dtrain OUT WORKERS FLAGS...: two epochs of `steps` steps; the second is the one counted.
run_dtrain() {
  local out="$1" w="$2"
  shift 2
  "$dtrain" launch --nproc-per-node "$w" -- "$dtrain" fit --strategy multi-worker --arch gpt \
    --corpus "$corpus" --context $ctx --layers $layers --d-model $d --heads $heads \
    --batch-size "$batch" --optimizer adamw --learning-rate 3e-4 --global-clipnorm 1.0 \
    --validation-split 0 --epochs 2 --steps-per-epoch "$steps" --threads 1 --seed 0 \
    --verbose 2 "$@" > "$out" 2>&1
}
# step_ms LOG: the last epoch's milliseconds per step ("-" for a run that was not made).
step_ms() {
  [[ -f "$1" ]] || { echo "-"; return; }
  grep -oE '[0-9]+ms/epoch' "$1" | tail -1 | sed 's/ms\/epoch//' |
    awk -v s="$steps" '{ printf "%.0f", $1 / s }'
}
# slots LOG: rank 0's optimizer_slot_bytes in the last epoch (logged with sharded state only).
slots() {
  grep -oE 'optimizer_slot_bytes: [0-9.]+' "$1" | tail -1 | awk '{ printf "%.0f", $2 }'
}
# full_slots LOG: AdamW's unsharded slot bytes, 2 moments x 4 bytes x the trainable parameters.
full_slots() {
  sed -n 's/.*Trainable params: \([0-9,]*\).*/\1/p' "$1" | head -1 | tr -d , |
    awk '{ printf "%.0f", 8 * $1 }'
}
torch_ms() {
  [[ -f "$1" ]] || { echo "-"; return; }
  awk '$1 == "step_seconds_median" { printf "%.0f", 1000 * $2 }' "$1"
}
torch_max_state() {
  awk '$1 ~ /^optimizer_state_bytes_rank/ && $2 > m { m = $2 } END { printf "%.0f", m }' "$1"
}

print_machine
echo "workload: context $ctx, $layers blocks, d_model $d, $heads heads, global batch $batch, AdamW, global_clipnorm 1.0; $steps steps per epoch, the second epoch timed"
printf '%-8s %9s %9s %9s %9s %9s %9s\n' "workers" "plain" "overlap" "zero-1" "zero-2" "ddp" "ddp+zero"
declare -A slot
for w in "${workers[@]}"; do
  run_dtrain "$tmp/plain.$w" "$w"
  run_dtrain "$tmp/overlap.$w" "$w" --overlap-gradients --bucket-cap-mb 1
  if [[ "$w" -gt 1 ]]; then
    run_dtrain "$tmp/z1.$w" "$w" --shard-optimizer-state 1
    run_dtrain "$tmp/z2.$w" "$w" --shard-optimizer-state 2
  fi
  /usr/bin/python3 bench/torch_lm_tokens.py "$corpus" $((steps + 2)) $ctx $layers $d $heads \
    "$batch" 1 "$w" 0 > "$tmp/ddp.$w" 2>&1
  if [[ "$w" -gt 1 ]]; then
    /usr/bin/python3 bench/torch_lm_tokens.py "$corpus" $((steps + 2)) $ctx $layers $d $heads \
      "$batch" 1 "$w" 1 > "$tmp/ddpz.$w" 2>&1
  fi
  printf '%-8s %9s %9s %9s %9s %9s %9s   (ms per step)\n' "$w" "$(step_ms "$tmp/plain.$w")" \
    "$(step_ms "$tmp/overlap.$w")" "$(step_ms "$tmp/z1.$w")" "$(step_ms "$tmp/z2.$w")" \
    "$(torch_ms "$tmp/ddp.$w")" "$(torch_ms "$tmp/ddpz.$w")"
  slot[$w]="$(full_slots "$tmp/plain.$w")"
done
echo
echo "optimizer-slot bytes per worker (AdamW m and v; sharded as a multiple of unsharded / N, target <= 1.05):"
for w in "${workers[@]}"; do
  [[ "$w" -gt 1 ]] || continue
  full="${slot[$w]}"
  tfull="$(torch_max_state "$tmp/ddp.$w")"
  z1="$(slots "$tmp/z1.$w")" z2="$(slots "$tmp/z2.$w")" tz="$(torch_max_state "$tmp/ddpz.$w")"
  awk -v w="$w" -v f="$full" -v a="$z1" -v b="$z2" -v tf="$tfull" -v tz="$tz" 'BEGIN {
    printf "  %d workers: dtrain %d unsharded, zero-1 %d (%.3f), zero-2 %d (%.3f); pytorch %d unsharded, ZeroRedundancyOptimizer largest rank %d (%.3f)\n",
      w, f, a, a / (f / w), b, b / (f / w), tf, tz, tz / (tf / w) }'
done
