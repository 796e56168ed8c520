#!/usr/bin/env bash
# The main job: install dependencies, build, then train the Fashion-MNIST MLP
# (Dense 128 relu -> Dense 10, Adam, batch 64) for 5 epochs and print the test accuracy.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install_deps.sh
scripts/build.sh
exec ./build/dtrain fit --epochs 5 --batch-size 64 --optimizer adam --seed 0 --validate "$@"
