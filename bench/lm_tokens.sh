#!/usr/bin/env bash
# Side-by-side training throughput of the issue's char-level GPT on the fortunes text: 4 blocks,
# d_model 128, 4 heads, context 128, batch 32, AdamW 3e-4 (about 0.84M parameters), one thread
# each (or THREADS=2): `dtrain fit --arch gpt` vs the same model in PyTorch 1.13
# (bench/torch_lm_tokens.py, nn.MultiheadAttention, clip_grad_norm_ 1.0). Reports tokens per
# second, dtrain's ratio, and the fraction of the GEMM floor (about 5.8 MFLOP per token).
# Usage: bench/lm_tokens.sh [steps_per_epoch] [rounds]   (THREADS=2 for two threads each)
# Needs a build (scripts/build.sh), python3-torch and the fortunes (scripts/install_deps.sh).
set -euo pipefail
source "$(dirname "$0")/lib.sh"
bench_setup
steps="${1:-10}"
rounds="${2:-2}"
threads="${THREADS:-1}"
export OMP_NUM_THREADS="$threads" OPENBLAS_NUM_THREADS="$threads"
dtrain="${BUILD_DIR:-build}/dtrain"
need_binary "$dtrain"
corpus="$tmp/fortunes.txt"
fortunes_corpus "$corpus"
ctx=128 layers=4 d=128 heads=4 batch=32
d_tps=() t_tps=()
for r in $(seq "$rounds"); do
  # Three epochs of `steps` steps; the first (warm-up) epoch is not counted.
  "$dtrain" fit --arch gpt --corpus "$corpus" --context $ctx --layers $layers --d-model $d \
    --heads $heads --batch-size $batch --optimizer adamw --learning-rate 3e-4 --global-clipnorm 1.0 \
    --validation-split 0 --epochs 3 --steps-per-epoch "$steps" --threads "$threads" --seed 0 \
    --verbose 2 > "$tmp/dtrain.$r" 2>&1
  epoch=$(dtrain_epoch "$tmp/dtrain.$r")
  d_tps+=("$(awk -v e="$epoch" -v s="$steps" -v b=$batch -v c=$ctx 'BEGIN { printf "%.0f", s * b * c / e }')")
  /usr/bin/python3 bench/torch_lm_tokens.py "$corpus" $((steps + 2)) $ctx $layers $d $heads $batch \
    "$threads" > "$tmp/torch.$r"
  t_tps+=("$(get tokens_per_second "$tmp/torch.$r")")
done
print_machine
echo "threads: $threads; workload: context $ctx, $layers blocks, d_model $d, $heads heads, batch $batch"
echo "parameters (torch): $(get params "$tmp/torch.$rounds"); vocabulary $(get vocab "$tmp/torch.$rounds")"
d=$(median "${d_tps[@]}")
t=$(median "${t_tps[@]}")
printf '%-36s %10s %10s\n' "tokens per second (median)" "$d" "$t"
echo "per-round tokens/s: dtrain ${d_tps[*]} | pytorch ${t_tps[*]}"
awk -v d="$d" -v t="$t" -v th="$threads" 'BEGIN {
  printf "speedup (dtrain / pytorch tokens per second): %.2fx  (target >= 1.5x)\n", d / t }'
# The floor: 5.8 MFLOP per token at the rate bench_gemm_floor measures for the MLP's GEMMs.
if [[ -f "$tmp/floor" ]]; then
  gflops=$(get gemm_gflops "$tmp/floor" || true)
  if [[ -n "$gflops" ]]; then
    awk -v d="$d" -v g="$gflops" -v th="$threads" 'BEGIN {
      printf "fraction of the GEMM floor: %.0f%% (5.8 MFLOP/token at %.1f GFLOP/s x %d threads)\n",
             100 * d * 5.8e6 / (g * 1e9 * th), g, th }'
  fi
fi
