#!/bin/sh
# Installs what herd needs on Debian 12 (when missing), then configures and
# builds herd, herd-server and herd-worker into build/ (the tests, the
# fuzzer and the emulated-device binaries are built by scripts/test.sh).
# Safe to rerun: installs nothing that is present and rebuilds
# incrementally. Set HERD_BUILD_DIR to build elsewhere.
set -eu
cd "$(dirname "$0")/.."

PACKAGES="build-essential cmake ninja-build pkg-config git
  libucx-dev ucx-utils protobuf-compiler libprotobuf-dev libgoogle-glog-dev
  libboost-dev libboost-system-dev libboost-context-dev libopenblas-openmp-dev libgtest-dev
  nlohmann-json3-dev zlib1g-dev clang libclang-rt-14-dev libomp-14-dev
  python3 python3-torch python3-numpy python3-venv python3-pip
  fortunes fortunes-min iproute2 slurmctld slurmd slurm-client munge"

missing=""
for p in $PACKAGES; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed"; then
    missing="$missing $p"
  fi
done
if [ -n "$missing" ]; then
  echo "setup: installing:$missing"
  SUDO=""
  if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends $missing
fi

BUILD="${HERD_BUILD_DIR:-build}"
if [ ! -f "$BUILD/build.ninja" ]; then
  cmake -G Ninja -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release
fi
ninja -C "$BUILD" herd herd-server herd-worker
