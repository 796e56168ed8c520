#!/bin/bash
# Parameter-server training throughput on loopback: Fashion-MNIST MLP (784-128-10, Adam,
# batch 32, one epoch = 1875 steps) with 1 ps + 2 workers (async and sync) against
# MultiWorkerMirrored with 2 workers, using the ps_worker test program. Prints samples/s (from
# fit's ms/epoch on the chief) and the mean pull / push latency per step the workers measured.
#   bench/ps_throughput.sh [BUILD_DIR]        (default: build)
set -euo pipefail
B=${1:-build}/tests/integration/ps_worker
[ -x "$B" ] || { echo "build ps_worker first (ninja ps_worker)"; exit 1; }
dir=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$dir"' EXIT
port() { python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])'; }
run() {  # MODE NPS NWORKERS
  local mode=$1 nps=$2 nw=$3 chief ps="" wk="" cl pids=()
  chief="\"127.0.0.1:$(port)\""
  for i in $(seq 1 "$nps"); do ps="$ps${ps:+,}\"127.0.0.1:$(port)\""; done
  for i in $(seq 1 "$nw"); do wk="$wk${wk:+,}\"127.0.0.1:$(port)\""; done
  cl="{\"chief\":[$chief],\"worker\":[$wk]${ps:+,\"ps\":[$ps]}}"
  for i in $(seq 0 $((nps - 1))); do
    TF_CONFIG="{\"cluster\":$cl,\"task\":{\"type\":\"ps\",\"index\":$i}}" "$B" >"$dir/ps$i" 2>&1 &
    pids+=($!)
  done
  for i in $(seq 0 $((nw - 1))); do
    TF_CONFIG="{\"cluster\":$cl,\"task\":{\"type\":\"worker\",\"index\":$i}}" "$B" --mode "$mode" >"$dir/w$i" 2>&1 &
    pids+=($!)
  done
  TF_CONFIG="{\"cluster\":$cl,\"task\":{\"type\":\"chief\",\"index\":0}}" timeout 300 "$B" --mode "$mode" >"$dir/chief" 2>&1
  wait "${pids[@]:$nps}" 2>/dev/null || true
  [ "$nps" -gt 0 ] && kill "${pids[@]:0:$nps}" 2>/dev/null || true
  local ms acc lat
  ms=$(grep -o '[0-9]*ms/epoch' "$dir/chief" | head -1 | tr -dc 0-9)
  acc=$(grep -o 'test_accuracy [0-9.]*' "$dir/chief" | cut -d' ' -f2)
  lat=$(grep -o 'pull_ms [0-9.]* push_ms [0-9.]*' "$dir/chief" || echo "-")
  printf '%-34s %8.0f samples/s  test_acc %s  %s\n' "$4" "$(echo "60000000/$ms" | bc -l)" "$acc" "$lat"
}
run async 1 2 "ParameterServer async, 1 ps + 2 w"
run sync 1 2 "ParameterServer sync, 1 ps + 2 w"
run async 2 2 "ParameterServer async, 2 ps + 2 w"
run mwms 0 1 "MultiWorkerMirrored, 2 workers"
