#!/usr/bin/env bash
# The fault-tolerance demo (docs/fault-tolerance.md): two local workers train the Fashion-MNIST
# MLP under MultiWorkerMirroredStrategy with backups every 200 steps; midway one worker is
# killed with SIGKILL; the launcher detects it, restarts the group, the workers resume exactly
# from the newest backup, and the job finishes with the expected accuracy. Then the event log
# and the TensorBoard entries show what happened.
# Usage: scripts/demo_fault_tolerance.sh [epochs=5] [kill-in-epoch=middle]   (after scripts/build.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
epochs="${1:-5}"
kill_epoch="${2:-$(((epochs + 1) / 2))}"
dtrain="${BUILD_DIR:-build}/dtrain"
[[ -x "$dtrain" ]] || { echo "missing $dtrain: run scripts/build.sh first" >&2; exit 1; }
run_dir="${DEMO_DIR:-demo_run}"
rm -rf "$run_dir"
mkdir -p "$run_dir"
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1

"$dtrain" launch --nproc-per-node 2 --max-restarts 3 --watchdog-timeout 30 \
  --event-log "$run_dir/events.jsonl" --logdir "$run_dir/logs" -- \
  "$dtrain" fit --strategy multi-worker --epochs "$epochs" --batch-size 64 --seed 0 --verbose 2 \
  --checkpoint-dir "$run_dir/ckpt" --checkpoint-every 200 --resume --logdir "$run_dir/logs" \
  --save "$run_dir/mnist_model.h5" > "$run_dir/launch.log" 2>&1 &
launcher=$!
tail -n +1 -f --pid="$launcher" "$run_dir/launch.log" &
follower=$!

# Kill worker 1 (the second training process the launcher started) once the chief has printed
# "Epoch <kill_epoch>/" and a backup was committed after that: by progress, not by time, whatever
# the machine's speed (an epoch takes well under a second here).
backups_before=-1
while kill -0 "$launcher" 2> /dev/null; do
  if [[ $backups_before -lt 0 ]] && grep -q "Epoch $kill_epoch/" "$run_dir/launch.log"; then
    backups_before=$(ls "$run_dir/ckpt" 2> /dev/null | grep -c '\.index$' || true)
    first_state=$(cat "$run_dir/ckpt/checkpoint" 2> /dev/null || true)
  fi
  if [[ $backups_before -ge 0 ]] &&
    [[ "$(cat "$run_dir/ckpt/checkpoint" 2> /dev/null || true)" != "$first_state" ]]; then
    break
  fi
  sleep 0.01
done
victim=""
for pid in $(pgrep -P "$launcher" 2>/dev/null || true); do
  if tr '\0' ' ' < "/proc/$pid/cmdline" 2>/dev/null | grep -q -- "fit --strategy multi-worker"; then
    victim="$pid"
  fi
done
if [[ -n "$victim" ]]; then
  echo "[demo] kill -9 $victim (worker 1): midway, once epoch $kill_epoch began and a backup followed"
  kill -9 "$victim"
else
  echo "[demo] the job finished before the kill (epoch $kill_epoch of $epochs)"
fi
status=0
wait "$launcher" || status=$?
wait "$follower" 2> /dev/null || true

echo
echo "[demo] event log ($run_dir/events.jsonl):"
if command -v python3 > /dev/null; then
  python3 -c 'import json,sys
for line in open(sys.argv[1]):
    e = json.loads(line); print("  gen %s %-10s %s" % (e.get("generation"), e["kind"], e.get("message", "")))' \
    "$run_dir/events.jsonl"
else
  sed 's/^/  /' "$run_dir/events.jsonl"
fi
echo
echo "[demo] TensorBoard text entries ($run_dir/logs/launcher):"
"$dtrain" events "$run_dir/logs/launcher" | grep 'plugin=text' | sed 's/^/  /' || true
exit "$status"
