#!/usr/bin/env bash
# Side-by-side epoch time of the built-in CNN on Fashion-MNIST (Conv2D(32,3,relu) → MaxPool →
# Conv2D(64,3,relu) → MaxPool → Flatten → Dense(128,relu) → Dense(10); batch 64, Adam, one
# thread): dtrain vs PyTorch 1.13 (oneDNN convolutions) in the same run, PyTorch both as it comes
# and with torch.set_flush_denormal(True); dtrain's speedup is taken against the faster of the
# two, and its epoch against the GEMM floor (the step's GEMMs alone, measured in-process by
# bench_cnn_epoch). Prints the CPU, the load average and the OpenBLAS kernels.
# Usage: bench/cnn_epoch.sh [epochs] [rounds]
# Needs a build (scripts/build.sh) and python3-torch (scripts/install_deps.sh --bench).
set -euo pipefail
cd "$(dirname "$0")/.."
epochs="${1:-3}"
rounds="${2:-1}"
bin="${BUILD_DIR:-build}/bench/bench_cnn_epoch"
[[ -x "$bin" ]] || { echo "missing $bin: run scripts/build.sh first" >&2; exit 1; }
# One thread each, and no OpenMP/BLAS pools competing for the two cores.
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1
# Some machines here force OpenBLAS's Haswell kernels (OPENBLAS_CORETYPE) for old builds' sake;
# Debian's OpenBLAS 0.3.21 picks its own (Cooperlake on the reference machine). Both programs
# use the same OpenBLAS, so the comparison is fair either way; set KEEP_OPENBLAS_ENV=1 to keep it.
if [[ -z "${KEEP_OPENBLAS_ENV:-}" ]]; then unset OPENBLAS_CORETYPE OPENBLAS_L2_SIZE; fi

get() { awk -v k="$1" '$1 == k { print $2 }' "$2"; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# Flush what earlier runs (a checkpoint benchmark, a build) left dirty, so that the kernel's
# writeback does not compete for the two cores while this measures.
sync
sleep 1
d_epochs=() t_epochs=() f_epochs=()
# Alternate the programs so that machine noise hits all alike.
for r in $(seq "$rounds"); do
  "$bin" "$epochs" 1 > "$tmp/dtrain.$r"
  /usr/bin/python3 bench/torch_cnn_epoch.py "$epochs" 1 0 > "$tmp/torch.$r"
  /usr/bin/python3 bench/torch_cnn_epoch.py "$epochs" 1 1 > "$tmp/torchftz.$r"
  d_epochs+=("$(get epoch_seconds_median "$tmp/dtrain.$r")")
  t_epochs+=("$(get epoch_seconds_median "$tmp/torch.$r")")
  f_epochs+=("$(get epoch_seconds_median "$tmp/torchftz.$r")")
done
median() { printf '%s\n' "$@" | sort -g | awk '{ a[NR] = $1 } END { print a[int((NR + 1) / 2)] }'; }
d=$(median "${d_epochs[@]}")
t=$(median "${t_epochs[@]}")
f=$(median "${f_epochs[@]}")
last_d="$tmp/dtrain.$rounds" last_t="$tmp/torch.$rounds" last_f="$tmp/torchftz.$rounds"
floor="${BUILD_DIR:-build}/bench/bench_gemm_floor"
[[ -x "$floor" ]] && "$floor" 1 > "$tmp/floor"
echo "CPU: $(lscpu | sed -n 's/^Model name:[[:space:]]*//p' | head -1) ($(getconf _NPROCESSORS_ONLN) CPUs); load average: $(cut -d' ' -f1-3 /proc/loadavg)"
if [[ -f "$tmp/floor" ]]; then
  echo "OpenBLAS: kernels $(get openblas_core "$tmp/floor"); $(sed -n 's/^openblas_config //p' "$tmp/floor")"
fi
echo "dtrain flushes denormals: ${DTRAIN_FLUSH_DENORMALS:-1} (DTRAIN_FLUSH_DENORMALS)"
printf '%-40s %10s %10s %12s\n' "metric" "dtrain" "pytorch" "pytorch+ftz"
row() { printf '%-40s %10s %10s %12s\n' "$1" "$(get "$2" "$last_d")" "$(get "$2" "$last_t")" "$(get "$2" "$last_f")"; }
printf '%-40s %10s %10s %12s\n' "epoch seconds (median of rounds)" "$d" "$t" "$f"
row "evaluate seconds (10k examples)" evaluate_seconds
row "test accuracy after $epochs epochs" test_accuracy
row "peak RSS MiB" peak_rss_mib
printf '%-40s %10s\n' "tensor buffers from the OS after epoch 1" "$(get system_allocations_after_epoch_1 "$last_d")"
echo "per-round epoch seconds: dtrain ${d_epochs[*]} | pytorch ${t_epochs[*]} | pytorch+ftz ${f_epochs[*]}"
awk -v d="$d" -v t="$t" -v f="$f" 'BEGIN {
  best = t < f ? t : f; which = t < f ? "default" : "flush_denormal"
  printf "speedup (faster pytorch (%s) / dtrain epoch time): %.2fx  (target >= 2x)\n", which, best / d }'
cf=$(get gemm_floor_seconds "$last_d")
awk -v d="$d" -v g="$cf" 'BEGIN {
  printf "GEMM floor (the CNN step GEMMs alone, 938 steps): %.3f s; dtrain reaches %.0f%% of it (epoch %.3f s)\n", g, 100 * g / d, d }'
echo "evaluate speedup: $(awk -v a="$(get evaluate_seconds "$last_d")" -v b="$(get evaluate_seconds "$last_t")" -v c="$(get evaluate_seconds "$last_f")" 'BEGIN { m = b < c ? b : c; printf "%.2fx (target >= 2x)", m / a }')"
