#!/usr/bin/env bash
# Runs the test suite on a busy machine: ctest in build/ and in build-emulated/ (label
# nccl_emulation), ROUNDS times in a row (default 2), while SPIN busy loops per core (default 2)
# keep every core busy. A test that passes on a quiet machine and fails here depends on how fast
# the machine is, which no test may (docs/testing.md). Build first (launch/test.sh, or
# RINGATTN_QUICK=1 launch/test.sh); extra arguments go to both ctest runs (e.g. -R cli_).
#
#   launch/stress-test.sh [ROUNDS] [-- CTEST_ARGS...]
set -euo pipefail
cd "$(dirname "$0")/.."

rounds=2
if [ $# -gt 0 ] && [ "$1" != "--" ]; then
  rounds=$1
  shift
fi
[ "${1:-}" = "--" ] && shift
case "$rounds" in '' | *[!0-9]*) echo "launch/stress-test.sh: ROUNDS must be a number, not '$rounds'" >&2; exit 2 ;; esac
for dir in build build-emulated; do
  [ -f "$dir/CTestTestfile.cmake" ] ||
    { echo "launch/stress-test.sh: $dir/ has no tests: run launch/test.sh first" >&2; exit 2; }
done

spinners=()
stop_spinners() { [ ${#spinners[@]} -eq 0 ] || kill "${spinners[@]}" 2>/dev/null || true; }
trap stop_spinners EXIT
for _ in $(seq $(( ${SPIN:-2} * $(nproc) ))); do
  (while :; do :; done) &
  spinners+=($!)
done
echo "[stress-test.sh] ${#spinners[@]} busy loops on $(nproc) cores"

source launch/env.sh
for round in $(seq "$rounds"); do
  start=$SECONDS
  ctest --test-dir build --output-on-failure --timeout 1800 -j"$(nproc)" "$@"
  ctest --test-dir build-emulated --output-on-failure --timeout 1800 -L nccl_emulation "$@"
  echo "[stress-test.sh] round $round of $rounds passed in $(( SECONDS - start )) s (load: $(cut -d' ' -f1-3 /proc/loadavg))"
done
