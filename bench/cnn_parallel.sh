#!/usr/bin/env bash
# The built-in CNN of bench/cnn_epoch.sh on both cores, side by side with PyTorch 1.13 (as it
# comes and with torch.set_flush_denormal(True); speedups against the faster):
#  - 2 threads: bench_cnn_epoch with 2 threads (every kernel of the step on one OpenMP team:
#    oneDNN's convolutions, the GEMMs in row blocks and dtrain's own kernels) against
#    torch.set_num_threads(2); batch 64. On a shared machine both sides' spinning teams inflate
#    wall time many times over; OMP_WAIT_POLICY=passive (for both) avoids most of it.
#  - 2 workers x 32: `dtrain launch` of two `dtrain fit --arch cnn --strategy multi-worker`
#    processes (one thread each, Gloo on loopback) against DDP (gloo, 2 processes x 1 thread);
#    global batch 64.
# Peak RSS: the largest process's (each dtrain worker under /usr/bin/time; each DDP rank).
# Usage: bench/cnn_parallel.sh [epochs] [rounds]     (needs scripts/build.sh, python3-torch)
# CNN_STEPS=N stops every program's epochs after N steps (a shorter run on a loaded machine; the
# "epoch seconds" are then per N steps, and the accuracies after N steps).
set -euo pipefail
source "$(dirname "$0")/lib.sh"
bench_setup
epochs="${1:-2}"
rounds="${2:-1}"
bin="${BUILD_DIR:-build}/bench/bench_cnn_epoch"
dtrain="${BUILD_DIR:-build}/dtrain"
need_binary "$bin"
need_binary "$dtrain"
steps="${CNN_STEPS:-0}"
torch_cnn() { /usr/bin/python3 bench/torch_cnn_epoch.py "$@"; }
fit_steps=()
if [[ "$steps" -gt 0 ]]; then fit_steps=(--steps-per-epoch "$steps"); fi
d2=() t2=() f2=() mw=() ddp=() ddpf=()
# Alternate the programs so that machine noise hits all alike.
for r in $(seq "$rounds"); do
  CNN_SKIP_FLOOR=1 OMP_NUM_THREADS=2 "$bin" "$epochs" 2 0 "$steps" > "$tmp/d2.$r"
  OMP_NUM_THREADS=2 torch_cnn "$epochs" 2 0 0 1 "$steps" > "$tmp/t2.$r"
  OMP_NUM_THREADS=2 torch_cnn "$epochs" 2 1 0 1 "$steps" > "$tmp/f2.$r"
  d2+=("$(get epoch_seconds_median "$tmp/d2.$r")")
  t2+=("$(get epoch_seconds_median "$tmp/t2.$r")")
  f2+=("$(get epoch_seconds_median "$tmp/f2.$r")")
  "$dtrain" launch --nproc-per-node 2 -- /usr/bin/time -f 'peak_rss_kib %M' "$dtrain" fit \
    --arch cnn --strategy multi-worker --epochs "$epochs" --batch-size 64 --seed 0 --verbose 2 \
    "${fit_steps[@]}" > "$tmp/mw.$r" 2>&1
  mw+=("$(dtrain_epoch "$tmp/mw.$r")")
  torch_cnn "$epochs" 1 0 0 2 "$steps" > "$tmp/ddp.$r" 2>&1
  torch_cnn "$epochs" 1 1 0 2 "$steps" > "$tmp/ddpf.$r" 2>&1
  ddp+=("$(get epoch_seconds_median "$tmp/ddp.$r")")
  ddpf+=("$(get epoch_seconds_median "$tmp/ddpf.$r")")
done
print_machine
if [[ "$steps" -gt 0 ]]; then echo "CNN_STEPS=$steps: every epoch stops after $steps steps"; fi
echo "== 2 threads, batch 64 =="
last_d="$tmp/d2.$rounds" last_t="$tmp/t2.$rounds" last_f="$tmp/f2.$rounds"
header
printf '%-44s %10s %10s %12s\n' "epoch seconds (median of rounds)" "$(median "${d2[@]}")" \
  "$(median "${t2[@]}")" "$(median "${f2[@]}")"
row "evaluate seconds (10k examples)" evaluate_seconds
row "test accuracy after $epochs epochs" test_accuracy
row "peak RSS MiB" peak_rss_mib
echo "per-round epoch seconds: dtrain ${d2[*]} | pytorch ${t2[*]} | pytorch+ftz ${f2[*]}"
speedup "$(median "${d2[@]}")" "$(median "${t2[@]}")" "$(median "${f2[@]}")" 2x
echo "== 2 workers x 32 (MultiWorkerMirrored vs DDP) =="
acc_mw=$(grep -oE 'test_accuracy: [0-9.]+' "$tmp/mw.$rounds" | awk '{ print $2 }' | head -1)
printf '%-44s %10s %10s %12s\n' "metric" "dtrain" "ddp" "ddp+ftz"
printf '%-44s %10s %10s %12s\n' "epoch seconds (median of rounds)" "$(median "${mw[@]}")" \
  "$(median "${ddp[@]}")" "$(median "${ddpf[@]}")"
printf '%-44s %10s %10s %12s\n' "test accuracy after $epochs epochs" "$acc_mw" \
  "$(get test_accuracy "$tmp/ddp.$rounds")" "$(get test_accuracy "$tmp/ddpf.$rounds")"
printf '%-44s %10s %10s %12s\n' "peak RSS MiB (largest process)" "$(max_rss_mib "$tmp/mw.$rounds")" \
  "$(get peak_rss_mib "$tmp/ddp.$rounds")" "$(get peak_rss_mib "$tmp/ddpf.$rounds")"
echo "per-round epoch seconds: dtrain ${mw[*]} | ddp ${ddp[*]} | ddp+ftz ${ddpf[*]}"
speedup "$(median "${mw[@]}")" "$(median "${ddp[@]}")" "$(median "${ddpf[@]}")" 2x
