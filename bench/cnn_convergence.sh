#!/usr/bin/env bash
# The issue's convergence bar for the built-in CNN: Adam 1e-3, batch 64, test accuracy after 3
# epochs, median of 3 seeds (target >= 0.885; PyTorch 1.13 with the same model here: 0.888).
# Too slow for CI (tests/train/cnn_convergence_test.cc checks 300 steps of one seed instead).
# Usage: bench/cnn_convergence.sh [epochs] [seeds]
set -euo pipefail
cd "$(dirname "$0")/.."
epochs="${1:-3}"
seeds="${2:-3}"
bin="${BUILD_DIR:-build}/bench/bench_cnn_epoch"
[[ -x "$bin" ]] || { echo "missing $bin: run scripts/build.sh first" >&2; exit 1; }
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 CNN_SKIP_FLOOR=1
accs=()
for s in $(seq 0 $((seeds - 1))); do
  a=$("$bin" "$epochs" 1 "$s" | awk '$1 == "test_accuracy" { print $2 }')
  echo "seed $s: test accuracy $a after $epochs epochs"
  accs+=("$a")
done
m=$(printf '%s\n' "${accs[@]}" | sort -g | awk '{ a[NR] = $1 } END { print a[int((NR + 1) / 2)] }')
echo "median test accuracy: $m (target >= 0.885)"
