#!/usr/bin/env bash
# Side-by-side epoch time of the Fashion-MNIST MLP (784-128-10, batch 64, Adam, one thread):
# dtrain vs PyTorch 1.13 in the same run. Usage: bench/mlp_epoch.sh [epochs] [rounds]
# Needs a build (scripts/build.sh) and python3-torch (scripts/install_deps.sh --bench).
set -euo pipefail
cd "$(dirname "$0")/.."
epochs="${1:-4}"
rounds="${2:-3}"
bin="${BUILD_DIR:-build}/bench/bench_mlp_epoch"
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
d_epochs=() t_epochs=()
# Alternate the two programs so that machine noise hits both alike.
for r in $(seq "$rounds"); do
  "$bin" "$epochs" 1 > "$tmp/dtrain.$r"
  /usr/bin/python3 bench/torch_mlp_epoch.py "$epochs" 1 > "$tmp/torch.$r"
  d_epochs+=("$(get epoch_seconds_median "$tmp/dtrain.$r")")
  t_epochs+=("$(get epoch_seconds_median "$tmp/torch.$r")")
done
median() { printf '%s\n' "$@" | sort -g | awk '{ a[NR] = $1 } END { print a[int((NR + 1) / 2)] }'; }
d=$(median "${d_epochs[@]}")
t=$(median "${t_epochs[@]}")
last_d="$tmp/dtrain.$rounds" last_t="$tmp/torch.$rounds"
floor="${BUILD_DIR:-build}/bench/bench_gemm_floor"
[[ -x "$floor" ]] && "$floor" 1 > "$tmp/floor"
printf '%-36s %12s %12s\n' "metric" "dtrain" "pytorch"
printf '%-36s %12s %12s\n' "epoch seconds (median of rounds)" "$d" "$t"
printf '%-36s %12s %12s\n' "evaluate seconds (10k examples)" "$(get evaluate_seconds "$last_d")" "$(get evaluate_seconds "$last_t")"
printf '%-36s %12s %12s\n' "test accuracy after $epochs epochs" "$(get test_accuracy "$last_d")" "$(get test_accuracy "$last_t")"
printf '%-36s %12s %12s\n' "peak RSS MiB" "$(get peak_rss_mib "$last_d")" "$(get peak_rss_mib "$last_t")"
printf '%-36s %12s %12s\n' "tensor buffers from the OS after epoch 1" "$(get system_allocations_after_epoch_1 "$last_d")" "-"
if [[ -f "$tmp/floor" ]]; then
  echo "OpenBLAS kernels: $(get openblas_core "$tmp/floor"); the five GEMMs of an epoch alone: $(get gemm_epoch_seconds "$tmp/floor") s"
fi
echo "per-round epoch seconds: dtrain ${d_epochs[*]} | pytorch ${t_epochs[*]}"
awk -v d="$d" -v t="$t" 'BEGIN { printf "speedup (pytorch / dtrain epoch time): %.2fx\n", t / d }'
