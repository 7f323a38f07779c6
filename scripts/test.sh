#!/bin/sh
# The whole test suite: set-up (install + build) then every test, in
# parallel. What CI runs; `--long` runs the full matrices and trial counts
# too (before resolving an issue that touches them).
set -eu
cd "$(dirname "$0")/.."
# --long: the full matrices and trial counts (tests read HERD_TEST_LONG).
if [ "${1:-}" = "--long" ]; then export HERD_TEST_LONG=1; shift; fi
if [ $# -ne 0 ]; then echo "usage: scripts/test.sh [--long]" >&2; exit 2; fi
scripts/setup.sh
BUILD="${HERD_BUILD_DIR:-build}"
ninja -C "$BUILD"  # everything else: tests, fuzzer, emulated-device binaries
# clang's thread-safety analysis over the product (docs/testing.md): any
# warning fails, before the tests run.
scripts/thread_safety_check.py "$BUILD"
JOBS="${HERD_TEST_JOBS:-$(nproc)}"
ctest --test-dir "$BUILD" -j "$JOBS" --output-on-failure --timeout 900
