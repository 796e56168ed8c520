#!/usr/bin/env bash
# The main job: install dependencies, build, then run the fault-tolerance demo — two local
# workers train the Fashion-MNIST MLP (Dense 128 relu -> Dense 10, Adam, global batch 64,
# 5 epochs) under MultiWorkerMirroredStrategy; one is killed midway; the job recovers by itself,
# finishes, prints the test accuracy, and the event log shows what happened.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install_deps.sh
scripts/build.sh
exec scripts/demo_fault_tolerance.sh "$@"
