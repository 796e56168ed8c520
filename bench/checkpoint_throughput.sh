#!/usr/bin/env bash
# Checkpoint save/restore throughput for about 1 GiB of float32 variables, side by side in one
# run: dtrain (build/bench/bench_checkpoint_throughput), torch.save/torch.load of the same tensors
# (bench/checkpoint_torch.py, PyTorch 1.13 from Debian's python3-torch) and
# `dd if=/dev/zero bs=1M conv=fsync` into the same directory. The three alternate, one repeat each
# per round, and the medians over rounds are compared.
# Usage: bench/checkpoint_throughput.sh [dir=/tmp/dtrain_ckpt_bench] [mib=1024] [tensors=16] [rounds=5]
set -euo pipefail
cd "$(dirname "$0")/.."
dir="${1:-/tmp/dtrain_ckpt_bench}"
mib="${2:-1024}"
tensors="${3:-16}"
rounds="${4:-5}"
bin="${BUILD_DIR:-build}/bench/bench_checkpoint_throughput"
[[ -x "$bin" ]] || { echo "missing $bin: run scripts/build.sh first" >&2; exit 1; }
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1
mkdir -p "$dir"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp" "$dir/dd.bin"' EXIT

get() { awk -v k="$1" '$1 == k { print $2 }' "$2"; }
median() { printf '%s\n' "$@" | sort -g | awk '{ a[NR] = $1 } END { print a[int((NR + 1) / 2)] }'; }
declare -A all
add() { all[$1]="${all[$1]:-} $2"; }
for r in $(seq "$rounds"); do
  "$bin" "$dir" "$mib" "$tensors" 1 > "$tmp/dtrain.$r"
  for k in save_sync_seconds save_nosync_seconds async_save_blocking_seconds \
           async_save_total_seconds restore_seconds memcpy_fresh_seconds memcpy_prefaulted_seconds; do
    add "d_$k" "$(get "$k" "$tmp/dtrain.$r")"
  done
  /usr/bin/python3 bench/checkpoint_torch.py "$dir" "$mib" "$tensors" 1 > "$tmp/torch.$r"
  for k in save_sync_seconds save_nosync_seconds load_seconds; do
    add "t_$k" "$(get "$k" "$tmp/torch.$r")"
  done
  rm -f "$dir/dd.bin"
  # dd prints "... bytes (...) copied, S s, R MB/s" on its last line.
  dd if=/dev/zero of="$dir/dd.bin" bs=1M count="$mib" conv=fsync 2> "$tmp/dd.$r"
  add dd_seconds "$(tail -1 "$tmp/dd.$r" | sed -E 's/.*copied, ([0-9.e+-]+) s.*/\1/')"
  rm -f "$dir/dd.bin"
done
m() { median ${all[$1]}; }
bytes=$(get bytes "$tmp/dtrain.1")
gbs() { awk -v b="$bytes" -v s="$1" 'BEGIN { printf "%.2f", b / s / 1e9 }'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", a / b }'; }
d_sync=$(m d_save_sync_seconds) t_sync=$(m t_save_sync_seconds) dd=$(m dd_seconds)
d_nosync=$(m d_save_nosync_seconds) t_nosync=$(m t_save_nosync_seconds)
d_restore=$(m d_restore_seconds) t_load=$(m t_load_seconds)
d_block=$(m d_async_save_blocking_seconds) d_async=$(m d_async_save_total_seconds)
mc_fresh=$(m d_memcpy_fresh_seconds) mc_warm=$(m d_memcpy_prefaulted_seconds)
echo "$tensors float32 tensors, $bytes bytes, in $dir ($(df -T "$dir" | awk 'NR == 2 { print $2 " on " $1 }')); medians of $rounds rounds"
printf '%-40s %10s %10s %10s\n' "metric (seconds; GB/s)" "dtrain" "torch" "dd"
printf '%-40s %10s %10s %10s\n' "save, fsynced" "$d_sync" "$t_sync" "$dd"
printf '%-40s %10s %10s %10s\n' "  throughput GB/s" "$(gbs "$d_sync")" "$(gbs "$t_sync")" "$(gbs "$dd")"
printf '%-40s %10s %10s %10s\n' "save, no fsync" "$d_nosync" "$t_nosync" "-"
printf '%-40s %10s %10s %10s\n' "restore / torch.load (page cache warm)" "$d_restore" "$t_load" "-"
printf '%-40s %10s %10s %10s\n' "  throughput GB/s" "$(gbs "$d_restore")" "$(gbs "$t_load")" "-"
printf '%-40s %10s %10s %10s\n' "async save: blocks the caller" "$d_block" "-" "-"
printf '%-40s %10s %10s %10s\n' "async save: until on disk" "$d_async" "-" "-"
printf '%-40s %10s %10s %10s\n' "memcpy of the variables, fresh buffers" "$mc_fresh" "-" "-"
printf '%-40s %10s %10s %10s\n' "memcpy, pre-faulted buffers" "$mc_warm" "-" "-"
echo "sync save vs torch.save+fsync: $(ratio "$t_sync" "$d_sync")x throughput (target >= 1.5)"
echo "sync save vs dd conv=fsync:    $(ratio "$dd" "$d_sync") of dd's throughput (target >= 0.70)"
echo "restore vs torch.load:         $(ratio "$t_load" "$d_restore")x (target >= 1)"
echo "async blocking / fresh memcpy: $(ratio "$d_block" "$mc_fresh") (target <= 1)"
echo "per round: dtrain save ${all[d_save_sync_seconds]} | torch save ${all[t_save_sync_seconds]} | dd ${all[dd_seconds]}"
echo "per round: dtrain restore ${all[d_restore_seconds]} | torch load ${all[t_load_seconds]} | async block ${all[d_async_save_blocking_seconds]} | memcpy ${all[d_memcpy_fresh_seconds]}"
