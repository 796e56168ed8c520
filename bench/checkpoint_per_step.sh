#!/usr/bin/env bash
# Per-step checkpointing cost on the Fashion-MNIST MLP (784-128-10, batch 64, Adam, one thread):
# epoch time with no checkpoints and with an async checkpoint (CheckpointManager, max_to_keep 3)
# every 1, 10 and 100 steps (pipelined: CheckpointOptions' default max_in_flight), and every step
# with max_in_flight 1 (each save waits for the previous one: the serialized reference),
# alternating the five runs each round; plus `dd if=/dev/zero bs=1M count=256 conv=fsync` in the
# same directory for the disk's bandwidth and `dd bs=4k count=500 oflag=dsync` for the latency of
# one synchronous small write (data + device flush).
# Usage: bench/checkpoint_per_step.sh [dir=/tmp/dtrain_ckpt_per_step] [epochs=3] [rounds=3]
set -euo pipefail
cd "$(dirname "$0")/.."
dir="${1:-/tmp/dtrain_ckpt_per_step}"
epochs="${2:-3}"
rounds="${3:-3}"
bin="${BUILD_DIR:-build}/bench/bench_checkpoint_per_step"
[[ -x "$bin" ]] || { echo "missing $bin: run scripts/build.sh first" >&2; exit 1; }
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1
# As bench/mlp_epoch.sh: let Debian's OpenBLAS pick its own kernels unless KEEP_OPENBLAS_ENV=1.
if [[ -z "${KEEP_OPENBLAS_ENV:-}" ]]; then unset OPENBLAS_CORETYPE OPENBLAS_L2_SIZE; fi
mkdir -p "$dir"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp" "$dir/dd.bin" "$dir/run"' EXIT
get() { awk -v k="$1" '$1 == k { print $2 }' "$2"; }
median() { printf '%s\n' "$@" | sort -g | awk '{ a[NR] = $1 } END { print a[int((NR + 1) / 2)] }'; }
declare -A epoch block
dd_all=()
dsync_all=()
for r in $(seq "$rounds"); do
  for n in 0 1 10 100 1s; do
    if [[ $n == 1s ]]; then args=(1 "$epochs" 1); else args=("$n" "$epochs"); fi
    "$bin" "$dir/run" "${args[@]}" > "$tmp/$n.$r"
    epoch[$n]="${epoch[$n]:-} $(get epoch_seconds_median "$tmp/$n.$r")"
    [[ $n != 0 ]] && block[$n]="${block[$n]:-} $(get save_blocking_ms_median "$tmp/$n.$r")"
  done
  rm -f "$dir/dd.bin"
  dd if=/dev/zero of="$dir/dd.bin" bs=1M count=256 conv=fsync 2> "$tmp/dd.$r"
  dd_all+=("$(tail -1 "$tmp/dd.$r" | sed -E 's/.*copied, ([0-9.e+-]+) s.*/\1/')")
  rm -f "$dir/dd.bin"
  dd if=/dev/zero of="$dir/dd.bin" bs=4k count=500 oflag=dsync 2> "$tmp/dsync.$r"
  dsync_all+=("$(tail -1 "$tmp/dsync.$r" | sed -E 's/.*copied, ([0-9.e+-]+) s.*/\1/' |
    awk '{ printf "%.3f", $1 / 500 * 1e3 }')")
  rm -f "$dir/dd.bin"
done
dd_s=$(median "${dd_all[@]}")
dd_bw=$(awk -v s="$dd_s" 'BEGIN { printf "%.0f", 256 * 1048576 / s }')
steps=$(get steps "$tmp/1.1")
steps_per_epoch=$((steps / epochs))
bytes=$(get checkpoint_bytes "$tmp/1.1")
base=$(median ${epoch[0]})
echo "Fashion-MNIST MLP, $steps_per_epoch steps/epoch, checkpoint $bytes bytes; dd conv=fsync: $(awk -v b="$dd_bw" 'BEGIN { printf "%.2f", b / 1e9 }') GB/s; medians of $rounds rounds (epochs 2..$epochs)"
printf '%-22s %12s %12s %14s %12s\n' "checkpoint" "epoch (s)" "overhead" "save blocks" "target"
printf '%-22s %12s %12s %14s %12s\n' "none" "$base" "-" "-" "-"
for n in 100 10 1 1s; do
  e=$(median ${epoch[$n]})
  over=$(awk -v e="$e" -v b="$base" 'BEGIN { printf "%.1f%%", 100 * (e - b) / b }')
  case $n in
    100) target="<= 3%" ;;
    # The disk's own limit: every step writes `bytes`; at dd's bandwidth that takes bytes/bw.
    1 | 1s) target=$(awk -v b="$bytes" -v bw="$dd_bw" -v s="$steps_per_epoch" -v base="$base" \
         'BEGIN { f = s * b / bw; printf "<= %.3f s", 1.1 * (f > base ? f : base) }') ;;
    *) target="-" ;;
  esac
  label="async, every $n"
  [[ $n == 1s ]] && label="every 1, 1 in flight"
  printf '%-22s %12s %12s %11s ms %12s\n' "$label" "$e" "$over" "$(median ${block[$n]})" "$target"
done
awk -v b="$bytes" -v bw="$dd_bw" -v s="$steps_per_epoch" 'BEGIN {
  printf "disk floor for every step: %d x %d B / %.2f GB/s = %.3f s per epoch\n", s, b, bw / 1e9, s * b / bw }'
echo "synchronous 4 KiB write (dd oflag=dsync), ms each: median $(median "${dsync_all[@]}")"
for n in 0 1 10 100 1s; do echo "per round, every $n: ${epoch[$n]}"; done
echo "per round, dd 256 MiB seconds: ${dd_all[*]}"
echo "per round, dd 4 KiB dsync ms: ${dsync_all[*]}"
