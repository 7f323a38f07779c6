#!/bin/sh
# Packs what scripts/gpu_check.py needs into one tarball, for a GPU node
# that has the NVIDIA driver, CUDA, NCCL and Python with PyTorch but none of
# Debian's libraries (no UCX, protobuf, glog, Boost or OpenBLAS):
#
#   scripts/gpu_kit.sh [--emulated] BUILD_DIR KIT.tar.xz|KIT_DIR
#
# (a name ending in .tar.xz is a tarball, anything else a new folder)
#   bin/   herd, herd-server, herd-worker and the gtest binary (herd_tests,
#          whose CUDA tests skip without a device)
#   lib/   every shared library they need but the C library and CUDA/NCCL,
#          UCX's transport modules in lib/ucx (the install step's bundle)
#   share/ the PyTorch anchor of `herd bench gpu`, configs/
#   data/  the default job's token files (train.bin, val.bin), prepared
#          here from the fortunes corpus, so no corpus need travel
#
# --emulated packs BUILD_DIR/emulated's binaries and herd_cuda_emu_tests
# instead (herd's CUDA sources on the emulated device), so that
# gpu_check.py can be run end to end on a machine without a GPU.
set -eu
emulated=0
if [ "${1:-}" = "--emulated" ]; then emulated=1; shift; fi
if [ $# -ne 2 ]; then
  echo "usage: scripts/gpu_kit.sh [--emulated] BUILD_DIR KIT.tar.xz|KIT_DIR" >&2
  exit 2
fi
build=$(cd "$1" && pwd)
case "$2" in /*) out="$2" ;; *) out="$(pwd)/$2" ;; esac
cd "$(dirname "$0")/.."
source_dir=$(pwd)

for f in "$out" "$out.partial"; do
  if [ -e "$f" ]; then echo "gpu_kit: $f exists; not overwriting it" >&2; exit 2; fi
done
needs="herd herd-server herd-worker tests/herd_tests"
if [ $emulated = 1 ]; then needs="$needs emulated/herd emulated/herd-server emulated/herd-worker tests/herd_cuda_emu_tests"; fi
for f in $needs; do
  if [ ! -x "$build/$f" ]; then echo "gpu_kit: no $build/$f; build first (ninja -C $build)" >&2; exit 2; fi
done

stage=$(mktemp -d)
trap 'rm -rf "$stage" "$out.partial"' EXIT
kit="$stage/herd-gpu-kit"
cmake --install "$build" --prefix "$kit" > /dev/null
if [ $emulated = 1 ]; then
  cp "$build/emulated/herd" "$build/emulated/herd-server" "$build/emulated/herd-worker" "$kit/bin/"
  cp "$build/tests/herd_cuda_emu_tests" "$kit/bin/herd_tests"
  # The emulated device's fibers: the one library the real build lacks.
  cp -L "$(ldd "$build/emulated/herd" | awk '/libboost_context/ {print $3}')" "$kit/lib/"
else
  cp "$build/tests/herd_tests" "$kit/bin/"
fi
# herd_tests is a build-tree binary: the loader finds lib/ through
# LD_LIBRARY_PATH (gpu_check.py sets it). Anything it needs beyond the
# install's bundle would be missing on the node: refuse instead.
for lib in $(ldd "$kit/bin/herd_tests" | awk '/=> \// {print $1}'); do
  case "$lib" in
    libc.so*|libm.so*|libdl.so*|libpthread.so*|librt.so*|libcuda.so*) ;;
    *) if [ ! -e "$kit/lib/$lib" ]; then echo "gpu_kit: herd_tests needs $lib, which is not in the bundle" >&2; exit 1; fi ;;
  esac
done

mkdir -p "$kit/data"
(cd "$stage" && "$kit/bin/herd" prepare /usr/share/games/fortunes/* --out "$kit/data/train.bin" \
   --val-out "$kit/data/val.bin" --val-fraction 0.05 > /dev/null)
case "$out" in
  *.tar.xz) tar -C "$stage" -cJf "$out.partial" herd-gpu-kit ;;
  *) mv "$kit" "$out.partial" ;;
esac
mv "$out.partial" "$out"
echo "{\"kit\": \"$out\", \"bytes\": $(du -sb "$out" | cut -f1), \"emulated\": $([ $emulated = 1 ] && echo true || echo false), \"source\": \"$(git -C "$source_dir" rev-parse --short HEAD 2>/dev/null || echo unknown)\"}"
