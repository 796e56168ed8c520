#!/usr/bin/env bash
# Sharded checkpoint throughput (issue 14), side by side in one run: about 1 GiB of float32
# variables held by 2 workers (processes, replicated state), saved as a sharded TF-format
# checkpoint (each worker writes its partition as one data shard, the chief merges the index)
# against the chief writing the whole checkpoint alone; every worker restoring the whole state
# from each; and `dd if=/dev/zero bs=1M conv=fsync` of the same bytes into the same directory
# (write) and back (read, after dropping the file from the page cache where allowed). Each side
# alternates once per round; medians over rounds. The first restore of a process reads into fresh
# memory and the second into the buffers the first freed (the tensor cache), so which restore goes
# first alternates too (odd rounds the sharded one, even rounds the chief's): use an even number of
# rounds. The rounds line says which went first.
# Usage: bench/sharded_checkpoint_throughput.sh [dir=/tmp/dtrain_sharded_bench] [mib=1024]
#        [workers=2] [rounds=4]        (needs scripts/build.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
dir="${1:-/tmp/dtrain_sharded_bench}"
mib="${2:-1024}"
world="${3:-2}"
rounds="${4:-4}"
bin="${BUILD_DIR:-build}/bench/bench_sharded_checkpoint_throughput"
[[ -x "$bin" ]] || { echo "missing $bin: run scripts/build.sh first" >&2; exit 1; }
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1
mkdir -p "$dir"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp" "$dir/dd.bin" "$dir"/sharded_ckpt.* "$dir"/chief_ckpt.*' EXIT
avail=$(df -Pm "$dir" | awk 'NR == 2 { print $4 }')
if (( avail < 3 * mib + 512 )); then
  echo "$dir has $avail MiB free; this needs about $((3 * mib)) MiB" >&2
  exit 1
fi

get() { awk -v k="$1" '$1 == k { print $2 }' "$2"; }
median() { printf '%s\n' "$@" | sort -g | awk '{ a[NR] = $1 } END { print a[int((NR + 1) / 2)] }'; }
declare -A all
add() { all[$1]="${all[$1]:-} $2"; }
keys="save_sharded save_chief_alone restore_sharded_every_worker restore_chief_every_worker"
for r in $(seq "$rounds"); do
  rdzv="file://$tmp/store.$r"
  first=sharded
  (( r % 2 == 0 )) && first=chief
  firsts="${firsts:-}${firsts:+ }$first"
  pids=()
  for ((k = 1; k < world; k++)); do
    "$bin" --rank $k --world-size "$world" --rdzv "$rdzv" --dir "$dir" --mib "$mib" \
      --restore-first "$first" > "$tmp/rank$k.$r" 2>&1 &
    pids+=($!)
  done
  "$bin" --rank 0 --world-size "$world" --rdzv "$rdzv" --dir "$dir" --mib "$mib" \
    --restore-first "$first" > "$tmp/d.$r"
  wait "${pids[@]}"
  for k in $keys; do add "$k" "$(get "${k}_seconds" "$tmp/d.$r")"; done
  sync
  t0=$(date +%s.%N)
  dd if=/dev/zero of="$dir/dd.bin" bs=1M count="$mib" conv=fsync status=none
  t1=$(date +%s.%N)
  add dd_write "$(echo "$t1 - $t0" | bc -l)"
  # Read back: uncached if the page cache can be dropped for the file (dd's nocache flag).
  dd if="$dir/dd.bin" iflag=nocache count=0 status=none 2>/dev/null || true
  t0=$(date +%s.%N)
  dd if="$dir/dd.bin" of=/dev/null bs=1M status=none
  t1=$(date +%s.%N)
  add dd_read "$(echo "$t1 - $t0" | bc -l)"
  rm -f "$dir/dd.bin"
done
bytes=$(get bytes "$tmp/d.1")
gib=$(echo "$bytes / 1073741824" | bc -l)
echo "CPU: $(lscpu | sed -n 's/^Model name:[[:space:]]*//p' | head -1) ($(getconf _NPROCESSORS_ONLN) CPUs); load average: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "disk: $(df -P "$dir" | awk 'NR == 2 { print $1 }') ($dir); $world workers; shared-memory collectives: $(get shm "$tmp/d.1")"
printf '%-52s %10s %10s\n' "$(printf '%.2f' "$gib") GiB, medians of $rounds rounds" "seconds" "GiB/s"
for k in $keys dd_write dd_read; do
  # shellcheck disable=SC2086
  m=$(median ${all[$k]})
  printf '%-52s %10.3f %10.3f\n' "$k" "$m" "$(echo "$gib / $m" | bc -l)"
done
echo "rounds (restored first: $firsts):"; for k in $keys dd_write dd_read; do echo "  $k${all[$k]}"; done
