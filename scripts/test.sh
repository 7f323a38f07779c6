#!/bin/sh
# The whole test suite: set-up (install + build) then every test, in
# parallel. What CI runs.
set -eu
cd "$(dirname "$0")/.."
scripts/setup.sh
BUILD="${HERD_BUILD_DIR:-build}"
ninja -C "$BUILD"  # everything else: tests, fuzzer, emulated-device binaries
JOBS="${HERD_TEST_JOBS:-$(nproc)}"
ctest --test-dir "$BUILD" -j "$JOBS" --output-on-failure --timeout 900
