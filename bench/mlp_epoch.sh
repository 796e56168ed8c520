#!/usr/bin/env bash
# Side-by-side epoch time of the Fashion-MNIST MLP (784-128-10, batch 64, Adam, one thread):
# dtrain vs PyTorch 1.13 in the same run, PyTorch both as it comes and with
# torch.set_flush_denormal(True) (dtrain flushes denormals by default); dtrain's speedup is taken
# against the faster of the two, and against the GEMM floor. Prints the CPU and OpenBLAS kernels.
# Usage: bench/mlp_epoch.sh [epochs] [rounds]
# Needs a build (scripts/build.sh) and python3-torch (scripts/install_deps.sh --bench).
set -euo pipefail
source "$(dirname "$0")/lib.sh"
bench_setup
epochs="${1:-4}"
rounds="${2:-3}"
bin="${BUILD_DIR:-build}/bench/bench_mlp_epoch"
need_binary "$bin"
side_by_side "$bin" bench/torch_mlp_epoch.py "$epochs" "$rounds"
print_machine
header
printf '%-44s %10s %10s %12s\n' "epoch seconds (median of rounds)" "$d" "$t" "$f"
row "evaluate seconds (10k examples)" evaluate_seconds
row "test accuracy after $epochs epochs" test_accuracy
row "peak RSS MiB" peak_rss_mib
printf '%-44s %10s\n' "tensor buffers from the OS after epoch 1" "$(get system_allocations_after_epoch_1 "$last_d")"
echo "per-round epoch seconds: dtrain ${d_epochs[*]} | pytorch ${t_epochs[*]} | pytorch+ftz ${f_epochs[*]}"
speedup "$d" "$t" "$f" 2.2x
if [[ -f "$tmp/floor" ]]; then
  g=$(get gemm_epoch_seconds "$tmp/floor")
  awk -v d="$d" -v g="$g" 'BEGIN {
    printf "dtrain epoch / GEMM floor (%.4f s, the five GEMMs alone): %.2fx  (target <= 1.3x)\n", g, d / g }'
fi
