#!/usr/bin/env bash
# Side-by-side epoch time of the built-in CNN on Fashion-MNIST (Conv2D(32,3,relu) → MaxPool →
# Conv2D(64,3,relu) → MaxPool → Flatten → Dense(128,relu) → Dense(10); batch 64, Adam, one
# thread): dtrain vs PyTorch 1.13 (oneDNN convolutions) in the same run, PyTorch both as it comes
# and with torch.set_flush_denormal(True); dtrain's speedup is taken against the faster of the
# two, and its epoch against the GEMM floor (the step's GEMMs alone, measured in-process by
# bench_cnn_epoch). Prints the CPU, the load average, the OpenBLAS kernels and peak memory.
# bench/cnn_parallel.sh runs the same CNN with 2 threads and with 2 workers x 32.
# Usage: bench/cnn_epoch.sh [epochs] [rounds]
# Needs a build (scripts/build.sh) and python3-torch (scripts/install_deps.sh --bench).
set -euo pipefail
source "$(dirname "$0")/lib.sh"
bench_setup
epochs="${1:-3}"
rounds="${2:-1}"
bin="${BUILD_DIR:-build}/bench/bench_cnn_epoch"
need_binary "$bin"
side_by_side "$bin" bench/torch_cnn_epoch.py "$epochs" "$rounds"
print_machine
header
printf '%-44s %10s %10s %12s\n' "epoch seconds (median of rounds)" "$d" "$t" "$f"
row "epoch CPU seconds (last round)" epoch_cpu_seconds_median
row "evaluate seconds (10k examples)" evaluate_seconds
row "test accuracy after $epochs epochs" test_accuracy
row "peak RSS MiB" peak_rss_mib
printf '%-44s %10s\n' "tensor buffers from the OS after epoch 1" "$(get system_allocations_after_epoch_1 "$last_d")"
echo "per-round epoch seconds: dtrain ${d_epochs[*]} | pytorch ${t_epochs[*]} | pytorch+ftz ${f_epochs[*]}"
speedup "$d" "$t" "$f" 2x
# CPU time changes less than wall time when other processes share the cores.
echo "CPU-time $(speedup "$(get epoch_cpu_seconds_median "$last_d")" \
  "$(get epoch_cpu_seconds_median "$last_t")" "$(get epoch_cpu_seconds_median "$last_f")" 2x)"
cf=$(get gemm_floor_seconds "$last_d")
awk -v d="$d" -v g="$cf" 'BEGIN {
  printf "GEMM floor (the CNN step GEMMs alone, 938 steps): %.3f s; dtrain reaches %.0f%% of it (epoch %.3f s)\n", g, 100 * g / d, d }'
echo "evaluate speedup: $(awk -v a="$(get evaluate_seconds "$last_d")" -v b="$(get evaluate_seconds "$last_t")" -v c="$(get evaluate_seconds "$last_f")" 'BEGIN { m = b < c ? b : c; printf "%.2fx (target >= 2x)", m / a }')"
