#!/usr/bin/env bash
# Installs every Debian 12 package dtrain needs to build, test and run on its default data set.
# Usage: scripts/install_deps.sh [--bench]   (--bench adds PyTorch for the side-by-side benchmarks)
set -euo pipefail

packages=(
  build-essential cmake ninja-build ccache pkg-config git
  libopenblas-dev zlib1g-dev nlohmann-json3-dev libcli11-dev libdnnl-dev
  libleveldb-dev libsnappy-dev libhdf5-dev libzip-dev
  libgloo-dev libhiredis-dev libgrpc++-dev libprotobuf-dev protobuf-compiler protobuf-compiler-grpc
  redis-server etcd-server etcd-client iproute2
  libgtest-dev libgmock-dev libbenchmark-dev
  libsentencepiece-dev python3-h5py
  dataset-fashion-mnist fortunes
)
if [[ "${1:-}" == "--bench" ]]; then
  packages+=(python3-torch python3-numpy)
fi

sudo=""
if [[ $(id -u) -ne 0 ]]; then sudo="sudo"; fi

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "installing: ${missing[*]}"
  $sudo apt-get update
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y --no-install-recommends "${missing[@]}"
else
  echo "all dependencies are installed"
fi
