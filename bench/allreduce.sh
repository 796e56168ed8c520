#!/usr/bin/env bash
# All-reduce of 101,770 floats (the MLP's gradients) and 25M floats, 2 processes on loopback:
# dtrain's Gloo collectives (each algorithm) and its shared-memory transport side by side with
# torch.distributed (gloo). cpu_ms_per_op is rank 0's CPU time (user + system) per all-reduce.
#   bench/allreduce.sh [build-dir]      (default build/)
set -euo pipefail
build=${1:-build}
bin=$build/bench/bench_allreduce
here=$(cd "$(dirname "$0")" && pwd)
world=2
free_port() { /usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

run_dtrain() {  # floats iters algorithm transport
  local dir; dir=$(mktemp -d)
  local pids=()
  for ((r = 1; r < world; r++)); do
    "$bin" --rank $r --world-size $world --rdzv "file://$dir" --floats "$1" --iters "$2" \
      --algorithm "$3" --transport "$4" >/dev/null &
    pids+=($!)
  done
  "$bin" --rank 0 --world-size $world --rdzv "file://$dir" --floats "$1" --iters "$2" --algorithm "$3" \
    --transport "$4"
  wait "${pids[@]}"
  rm -rf "$dir"
}

run_torch() {  # floats iters
  local port; port=$(free_port)
  local pids=()
  for ((r = 1; r < world; r++)); do
    /usr/bin/python3 "$here/torch_allreduce.py" $r $world "$port" "$1" "$2" >/dev/null &
    pids+=($!)
  done
  /usr/bin/python3 "$here/torch_allreduce.py" 0 $world "$port" "$1" "$2"
  wait "${pids[@]}"
}

for spec in "101770 400" "25000000 15"; do
  set -- $spec
  echo "== $1 floats, $world processes on loopback"
  echo "load average: $(cut -d' ' -f1-3 /proc/loadavg)"
  run_dtrain "$1" "$2" auto shm | grep -E "impl|median|p10|p90|gbps|cpu_ms" | paste -sd' '
  for algo in auto ring ring_chunked halving_doubling reduce_scatter; do
    run_dtrain "$1" "$2" $algo gloo | grep -E "impl|median|p10|p90|gbps|cpu_ms" | paste -sd' '
  done
  run_torch "$1" "$2" | grep -E "impl|median|p10|p90|gbps" | paste -sd' '
done
