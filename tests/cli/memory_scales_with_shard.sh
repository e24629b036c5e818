#!/usr/bin/env bash
# Per-rank memory stays proportional to the shard: at 1M tokens, going from 2 to 8 ranks must
# divide each rank's peak memory (above the process baseline) by about 4. A buffer the size of the
# whole sequence (64 MiB per tensor here) on any rank would break the bound at 8 ranks.
# Usage: memory_scales_with_shard.sh BUILD_DIR MPIEXEC [MPIEXEC_FLAGS...]
set -euo pipefail
build=$1
shift
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

peak() {  # peak_rss_bytes of a run: peak NP ARGS...
  local np=$1
  shift
  "$@" >/dev/null 2>"$tmp/err" || { cat "$tmp/err"; exit 1; }
  sed -n 's/.*"peak_rss_bytes": \([0-9]*\).*/\1/p' "$tmp/out.json"
}
job=(--heads 1 --head-dim 16 --causal --window 64,0 --backward --json "$tmp/out.json")
base=$(peak 8 "$@" -np 8 "$build/ringattn" --seq-len 64 "${job[@]}")
p2=$(peak 2 "$@" -np 2 "$build/ringattn" --seq-len 1048576 "${job[@]}")
p8=$(peak 8 "$@" -np 8 "$build/ringattn" --seq-len 1048576 "${job[@]}")
# A quarter, plus 50% slack: besides its shard, a rank of 4-8 carries ~25 MiB that does not
# shrink with the shard nor grow with the sequence (MPI and runtime buffers; measured at L = 512K,
# 1M and 2M), 0.08 of the 2-rank growth by itself. A whole-sequence tensor adds 64 MiB, twice the
# slack.
limit=$(( base + (p2 - base) * 3 / 8 ))
echo "peak RSS per rank: baseline $((base >> 20)) MiB, 2 ranks $((p2 >> 20)) MiB, 8 ranks $((p8 >> 20)) MiB (limit $((limit >> 20)) MiB)"
if [ "$p8" -gt "$limit" ]; then
  echo "FAILED: per-rank memory does not shrink with the shard" >&2
  exit 1
fi
