#!/usr/bin/env bash
# Side-by-side epoch time of data-parallel training on the 2-core machine: the Fashion-MNIST MLP,
# global batch 64 = 2 workers x 32, Adam, one thread each. dtrain's MultiWorkerMirroredStrategy
# (two processes under `dtrain launch`, Gloo all-reduce on loopback) against PyTorch DDP (gloo
# backend; both as it comes and with torch.set_flush_denormal(True), the speedup taken against the
# faster), and MirroredStrategy with 2 replicas against 1 replica on the same global batch; the
# multi-worker run also with the all-reduce overlapped with backward (--overlap-gradients,
# 256 KiB buckets) and with sharded optimizer state (--shard-optimizer-state 1 and 2). The machine is
# shared, so the plain multi-worker run and the one-process batch-64 run also report their CPU time
# (user + system of all processes, from /usr/bin/time, data loading included), and a profiled run
# (--profile-steps) their step-time split per worker (compute, communication, waiting, other);
# the overlap and ZeRO runs report their CPU time too.
# The workers share this host, so their collectives run over shared memory; the plain run is
# repeated over Gloo's loopback TCP (DTRAIN_SHM_COLLECTIVES=0) for comparison, with its CPU time.
# SPIN_US=N adds the plain run with DTRAIN_SHM_SPIN_US=N (how long a shared-memory wait spins
# before it sleeps; default 10) beside the default one, with its CPU time.
# Usage: bench/multi_worker_epoch.sh [epochs] [rounds]     (needs scripts/build.sh, python3-torch)
set -euo pipefail
cd "$(dirname "$0")/.."
epochs="${1:-3}"
rounds="${2:-3}"
dtrain="${BUILD_DIR:-build}/dtrain"
[[ -x "$dtrain" ]] || { echo "missing $dtrain: run scripts/build.sh first" >&2; exit 1; }
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1
if [[ -z "${KEEP_OPENBLAS_ENV:-}" ]]; then unset OPENBLAS_CORETYPE OPENBLAS_L2_SIZE; fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# Flush what earlier runs (a checkpoint benchmark, a build) left dirty, so that the kernel's
# writeback does not compete for the two cores while this measures.
sync
sleep 1

# Median epoch time from dtrain's "NNN/NNN - ... - XXXms/epoch" lines, skipping the first epoch.
dtrain_epoch() {
  grep -oE '[0-9]+ms/epoch' "$1" | sed 's/ms\/epoch//' | tail -n +2 | sort -g |
    awk '{ a[NR] = $1 } END { printf "%.4f", a[int((NR + 1) / 2)] / 1000 }'
}
get() { awk -v k="$1" '$1 == k { print $2 }' "$2"; }
median() { printf '%s\n' "$@" | sort -g | awk '{ a[NR] = $1 } END { print a[int((NR + 1) / 2)] }'; }

# CPU seconds (user + system) of a command and its children, into "$1" (the rest is the command).
cpu() {
  local out="$1"
  shift
  /usr/bin/time -f "%U %S" -o "$out.cpu" "$@"
  awk '{ printf "%.2f", $1 + $2 }' "$out.cpu" > "$out.cpus"
}
# The per-step split (seconds) one profiled run wrote for run "$2" (profile/worker_N) under "$1":
# the medians over the reports of compute, communication, waiting, other and step.
split() {
  "$dtrain" events --json "$1/profile/$2" 2>/dev/null | /usr/bin/python3 -c '
import json, statistics, sys
v = {}
for line in sys.stdin:
    r = json.loads(line)
    for x in r.get("values", []):
        v.setdefault(x["tag"], []).append(x["value"])
med = lambda t: statistics.median(v.get("profile/" + t, [0]))
print("compute %.3f ms, communication %.3f ms, waiting %.3f ms, other %.3f ms, step %.3f ms" %
      tuple(1e3 * med(t) for t in ("compute_seconds", "communication_seconds", "waiting_seconds",
                                   "other_seconds", "step_seconds")))'
}

mwg=() mwgcpu=() mw=() mwo=() mwz1=() mwz2=() ddp=() ddpf=() m1=() m2=() mwcpu=() m1cpu=()
mwocpu=() mwz1cpu=() mwz2cpu=() mws=() mwscpu=()
for r in $(seq "$rounds"); do
  if [[ -n "${SPIN_US:-}" ]]; then
    DTRAIN_SHM_SPIN_US="$SPIN_US" cpu "$tmp/mws.$r" "$dtrain" launch --nproc-per-node 2 -- \
      "$dtrain" fit --strategy multi-worker --epochs "$epochs" --batch-size 64 --seed 0 \
      --verbose 2 > "$tmp/mws.$r" 2>&1
    mws+=("$(dtrain_epoch "$tmp/mws.$r")")
    mwscpu+=("$(cat "$tmp/mws.$r.cpus")")
  fi
  cpu "$tmp/mw.$r" "$dtrain" launch --nproc-per-node 2 -- "$dtrain" fit --strategy multi-worker \
    --epochs "$epochs" --batch-size 64 --seed 0 --verbose 2 > "$tmp/mw.$r" 2>&1
  mw+=("$(dtrain_epoch "$tmp/mw.$r")")
  mwcpu+=("$(cat "$tmp/mw.$r.cpus")")
  DTRAIN_SHM_COLLECTIVES=0 cpu "$tmp/mwg.$r" "$dtrain" launch --nproc-per-node 2 -- "$dtrain" fit \
    --strategy multi-worker --epochs "$epochs" --batch-size 64 --seed 0 --verbose 2 \
    > "$tmp/mwg.$r" 2>&1
  mwg+=("$(dtrain_epoch "$tmp/mwg.$r")")
  mwgcpu+=("$(cat "$tmp/mwg.$r.cpus")")
  cpu "$tmp/mwo.$r" "$dtrain" launch --nproc-per-node 2 -- "$dtrain" fit --strategy multi-worker \
    --epochs "$epochs" --batch-size 64 --seed 0 --verbose 2 --overlap-gradients --bucket-cap-mb 0.25 \
    > "$tmp/mwo.$r" 2>&1
  mwo+=("$(dtrain_epoch "$tmp/mwo.$r")")
  mwocpu+=("$(cat "$tmp/mwo.$r.cpus")")
  # Which stage runs first alternates by round (a run right after another one inherits its page
  # cache and scheduling state: session 7 always ran stage 2 second).
  zs="1 2"
  (( r % 2 == 0 )) && zs="2 1"
  for z in $zs; do
    cpu "$tmp/mwz$z.$r" "$dtrain" launch --nproc-per-node 2 -- "$dtrain" fit --strategy multi-worker \
      --epochs "$epochs" --batch-size 64 --seed 0 --verbose 2 --shard-optimizer-state "$z" \
      > "$tmp/mwz$z.$r" 2>&1
  done
  mwz1+=("$(dtrain_epoch "$tmp/mwz1.$r")")
  mwz2+=("$(dtrain_epoch "$tmp/mwz2.$r")")
  mwz1cpu+=("$(cat "$tmp/mwz1.$r.cpus")")
  mwz2cpu+=("$(cat "$tmp/mwz2.$r.cpus")")
  /usr/bin/python3 bench/torch_ddp_epoch.py "$epochs" 2 0 > "$tmp/ddp.$r" 2>&1
  ddp+=("$(get epoch_seconds_median "$tmp/ddp.$r")")
  /usr/bin/python3 bench/torch_ddp_epoch.py "$epochs" 2 1 > "$tmp/ddpf.$r" 2>&1
  ddpf+=("$(get epoch_seconds_median "$tmp/ddpf.$r")")
  cpu "$tmp/m1.$r" "$dtrain" fit --strategy mirrored --replicas 1 --epochs "$epochs" \
    --batch-size 64 --seed 0 --verbose 2 > "$tmp/m1.$r" 2>&1
  m1+=("$(dtrain_epoch "$tmp/m1.$r")")
  m1cpu+=("$(cat "$tmp/m1.$r.cpus")")
  "$dtrain" fit --strategy mirrored --replicas 2 --epochs "$epochs" --batch-size 64 --seed 0 \
    --verbose 2 > "$tmp/m2.$r" 2>&1
  m2+=("$(dtrain_epoch "$tmp/m2.$r")")
done
# One profiled run of each (not timed above: profiling adds a barrier per step).
"$dtrain" launch --nproc-per-node 2 -- "$dtrain" fit --strategy multi-worker --epochs 1 \
  --batch-size 64 --seed 0 --verbose 0 --logdir "$tmp/tb_mw" --profile-steps 100 > /dev/null 2>&1
"$dtrain" fit --strategy mirrored --replicas 1 --epochs 1 --batch-size 64 --seed 0 --verbose 0 \
  --logdir "$tmp/tb_m1" --profile-steps 100 > /dev/null 2>&1
acc_mw=$(grep -oE 'test_accuracy: [0-9.]+' "$tmp/mw.$rounds" | awk '{ print $2 }')
acc_ddp=$(get test_accuracy "$tmp/ddp.$rounds")
floor="${BUILD_DIR:-build}/bench/bench_gemm_floor"
echo "CPU: $(lscpu | sed -n 's/^Model name:[[:space:]]*//p' | head -1) ($(getconf _NPROCESSORS_ONLN) CPUs); load average: $(cut -d' ' -f1-3 /proc/loadavg)"
if [[ -x "$floor" ]]; then
  "$floor" 1 > "$tmp/floor"
  echo "OpenBLAS: kernels $(get openblas_core "$tmp/floor"); $(sed -n 's/^openblas_config //p' "$tmp/floor")"
fi
printf '%-52s %10s\n' "2 workers x 32, MultiWorkerMirrored (s/epoch)" "$(median "${mw[@]}")"
if [[ -n "${SPIN_US:-}" ]]; then
  printf '%-52s %10s\n' "  ... DTRAIN_SHM_SPIN_US=$SPIN_US" "$(median "${mws[@]}")"
fi
printf '%-52s %10s\n' "  ... over Gloo TCP (DTRAIN_SHM_COLLECTIVES=0)" "$(median "${mwg[@]}")"
printf '%-52s %10s\n' "  ... --overlap-gradients --bucket-cap-mb 0.25" "$(median "${mwo[@]}")"
printf '%-52s %10s\n' "  ... --shard-optimizer-state 1" "$(median "${mwz1[@]}")"
printf '%-52s %10s\n' "  ... --shard-optimizer-state 2" "$(median "${mwz2[@]}")"
printf '%-52s %10s\n' "2 workers x 32, PyTorch DDP gloo (s/epoch)" "$(median "${ddp[@]}")"
printf '%-52s %10s\n' "2 workers x 32, DDP + set_flush_denormal (s/epoch)" "$(median "${ddpf[@]}")"
printf '%-52s %10s\n' "MirroredStrategy 1 replica, batch 64 (s/epoch)" "$(median "${m1[@]}")"
printf '%-52s %10s\n' "MirroredStrategy 2 replicas, batch 64 (s/epoch)" "$(median "${m2[@]}")"
printf '%-52s %10s\n' "  CPU s (user + sys, all processes, whole run)" "$(median "${mwcpu[@]}")"
if [[ -n "${SPIN_US:-}" ]]; then
  printf '%-52s %10s\n' "  2 workers DTRAIN_SHM_SPIN_US=$SPIN_US: CPU s" "$(median "${mwscpu[@]}")"
fi
printf '%-52s %10s\n' "  2 workers over Gloo TCP: CPU s" "$(median "${mwgcpu[@]}")"
printf '%-52s %10s\n' "  2 workers --overlap-gradients: CPU s" "$(median "${mwocpu[@]}")"
printf '%-52s %10s\n' "  2 workers --shard-optimizer-state 1: CPU s" "$(median "${mwz1cpu[@]}")"
printf '%-52s %10s\n' "  2 workers --shard-optimizer-state 2: CPU s" "$(median "${mwz2cpu[@]}")"
printf '%-52s %10s\n' "  MirroredStrategy 1 replica, batch 64: CPU s" "$(median "${m1cpu[@]}")"
echo "step split, 2 workers x 32, worker 0: $(split "$tmp/tb_mw" worker_0)"
echo "step split, 2 workers x 32, worker 1: $(split "$tmp/tb_mw" worker_1)"
echo "step split, 1 process, batch 64:      $(split "$tmp/tb_m1" worker_0)"
printf '%-52s %10s %10s\n' "test accuracy after $epochs epochs (dtrain, DDP)" "$acc_mw" "$acc_ddp"
echo "rounds: multi-worker ${mw[*]} | ddp ${ddp[*]} | ddp+ftz ${ddpf[*]} | mirrored-1 ${m1[*]} | mirrored-2 ${m2[*]}"
awk -v a="$(median "${mw[@]}")" -v b="$(median "${ddp[@]}")" -v c="$(median "${ddpf[@]}")" 'BEGIN {
  best = b < c ? b : c; which = b < c ? "default" : "flush_denormal"
  printf "speedup over the faster DDP (%s): %.2fx  (target >= 5x)\n", which, best / a }'
awk -v a="$(median "${m2[@]}")" -v b="$(median "${m1[@]}")" \
  'BEGIN { printf "MirroredStrategy 2 replicas vs 1: %.2fx the time\n", a / b }'
