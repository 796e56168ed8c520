#!/usr/bin/env bash
# The char-level GPT of bench/lm_tokens.sh (4 blocks, d_model 128, 4 heads, context 128, global
# batch 32, AdamW 3e-4, global_clipnorm 1.0) on both cores, side by side with PyTorch 1.13:
#  - 2 threads: `dtrain fit --arch gpt --threads 2` (OpenBLAS, oneDNN's and parallel_for's
#    OpenMP team) against torch.set_num_threads(2).
#  - 2 workers x 16: `dtrain launch` of two `dtrain fit --arch gpt --strategy multi-worker`
#    processes (one thread each, Gloo on loopback) against DDP (gloo, 2 processes x 1 thread).
# Reports tokens per second (of the global batch), the ratios, and each program's CPU seconds
# (user + system, /usr/bin/time) beside its wall time, with the load average.
# Usage: bench/lm_parallel.sh [steps_per_epoch] [rounds]
# Needs a build (scripts/build.sh), python3-torch and the fortunes (scripts/install_deps.sh).
set -euo pipefail
source "$(dirname "$0")/lib.sh"
bench_setup
steps="${1:-10}"
rounds="${2:-2}"
dtrain="${BUILD_DIR:-build}/dtrain"
need_binary "$dtrain"
corpus="$tmp/fortunes.txt"
fortunes_corpus "$corpus"
ctx=128 layers=4 d=128 heads=4 batch=32
model=(--corpus "$corpus" --context $ctx --layers $layers --d-model $d --heads $heads
  --batch-size $batch --optimizer adamw --learning-rate 3e-4 --global-clipnorm 1.0
  --validation-split 0 --epochs 3 --steps-per-epoch "$steps" --seed 0 --verbose 2)
tps() { awk -v e="$1" -v s="$steps" -v b=$batch -v c=$ctx 'BEGIN { printf "%.0f", s * b * c / e }'; }
cpu() { awk '$1 == "cpu_seconds" { printf "%.1f", $2 + $3 }' "$1"; }
timed=(/usr/bin/time -f 'cpu_seconds %U %S' -o)
d2=() t2=() mw=() ddp=()
for r in $(seq "$rounds"); do
  # Three epochs of `steps` steps each; the first (warm-up) epoch is not counted.
  OMP_NUM_THREADS=2 OPENBLAS_NUM_THREADS=2 "${timed[@]}" "$tmp/d2cpu.$r" "$dtrain" fit \
    --arch gpt "${model[@]}" --threads 2 > "$tmp/d2.$r" 2>&1
  d2+=("$(tps "$(dtrain_epoch "$tmp/d2.$r")")")
  OMP_NUM_THREADS=2 "${timed[@]}" "$tmp/t2cpu.$r" /usr/bin/python3 bench/torch_lm_tokens.py \
    "$corpus" $((3 * steps)) $ctx $layers $d $heads $batch 2 > "$tmp/t2.$r"
  t2+=("$(get tokens_per_second "$tmp/t2.$r")")
  "${timed[@]}" "$tmp/mwcpu.$r" "$dtrain" launch --nproc-per-node 2 -- "$dtrain" fit --arch gpt \
    "${model[@]}" --strategy multi-worker > "$tmp/mw.$r" 2>&1
  mw+=("$(tps "$(dtrain_epoch "$tmp/mw.$r")")")
  # One DDP run hung idle once (session 6, not reproduced since): bounded, and reported.
  if ! "${timed[@]}" "$tmp/ddpcpu.$r" timeout "${TORCH_TIMEOUT:-900}" /usr/bin/python3 \
    bench/torch_lm_tokens.py "$corpus" $((3 * steps)) $ctx $layers $d $heads $batch 1 2 \
    > "$tmp/ddp.$r" 2>&1; then
    echo "DDP round $r failed or ran past ${TORCH_TIMEOUT:-900} s:" >&2
    tail -5 "$tmp/ddp.$r" >&2
    echo "tokens_per_second nan" > "$tmp/ddp.$r"
  fi
  ddp+=("$(get tokens_per_second "$tmp/ddp.$r")")
done
print_machine
echo "workload: context $ctx, $layers blocks, d_model $d, $heads heads, global batch $batch;" \
  "$steps steps per epoch (dtrain: epochs 2-3; PyTorch: steps after the first two)"
printf '%-40s %10s %10s %8s %22s\n' "tokens per second (median of rounds)" dtrain pytorch ratio \
  "cpu s (dtrain/pytorch)"
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2fx", a / b }'; }
printf '%-40s %10s %10s %8s %22s\n' "2 threads, batch 32" "$(median "${d2[@]}")" \
  "$(median "${t2[@]}")" "$(ratio "$(median "${d2[@]}")" "$(median "${t2[@]}")")" \
  "$(cpu "$tmp/d2cpu.$rounds") / $(cpu "$tmp/t2cpu.$rounds")"
printf '%-40s %10s %10s %8s %22s\n' "2 workers x 16 (MultiWorkerMirrored/DDP)" \
  "$(median "${mw[@]}")" "$(median "${ddp[@]}")" \
  "$(ratio "$(median "${mw[@]}")" "$(median "${ddp[@]}")")" \
  "$(cpu "$tmp/mwcpu.$rounds") / $(cpu "$tmp/ddpcpu.$rounds")"
echo "per-round tokens/s: 2 threads dtrain ${d2[*]} | pytorch ${t2[*]};" \
  "2 workers dtrain ${mw[*]} | ddp ${ddp[*]}"
echo "targets: 2 threads >= 1.5x PyTorch; 2 workers x 16 >= 3x DDP. CPU seconds cover the whole" \
  "program (start-up, data, warm-up epoch) of the last round."
