#!/usr/bin/env bash
# The hybrid's model (`ringattn plan --ulysses`) against measured runs over emulated links: at 4
# ranks, `ringattn bench --ulysses 1,2,4` with a slow link between groups and a faster one inside
# them, then `ringattn plan --calibrate POINTS --same-run --check`: each point is predicted with the
# kernel rate of its own run (so that a loaded or oversubscribed machine, e.g. 4 ranks on 2 cores,
# does not count against the model), and the table prints measured and predicted forward and
# backward times, their relative error, and the exposed communication measured and predicted.
# Exit 3 when a prediction misses by more than TOLERANCE (default 0.15).
#
#   launch/plan/check_hybrid_model.sh [BUILD_DIR]     (default build)
#
# The defaults make communication dominate (a few MB/s): times are then set by the emulated links,
# which the model describes, more than by the scheduler of a loaded machine. Environment:
# OUT (default hybrid-model/), RANKS (4), ULYSSES (1,2,4), SEQ_LEN (1024), HEADS (4), HEAD_DIM (32),
# INTER_GBPS (0.0005), INTER_US (100), INTRA_GBPS (0.002), INTRA_US (10), ITERS (2), TOLERANCE,
# MPIEXEC (mpirun).
set -euo pipefail
build=$(cd "${1:-build}" && pwd)
out=${OUT:-hybrid-model}
mkdir -p "$out"
mpiexec=${MPIEXEC:-mpirun}
uptime > "$out/load.txt" || true
"$mpiexec" --oversubscribe --bind-to none -np "${RANKS:-4}" "$build/ringattn" bench --ranks "${RANKS:-4}" \
  --ulysses "${ULYSSES:-1,2,4}" --seq-len "${SEQ_LEN:-1024}" --heads "${HEADS:-4}" --head-dim "${HEAD_DIM:-32}" \
  --causal --threads 1 --iters "${ITERS:-2}" --warmup 1 \
  --emulate-bandwidth "${INTER_GBPS:-0.0005}" --emulate-latency "${INTER_US:-100}" \
  --emulate-intra-bandwidth "${INTRA_GBPS:-0.002}" --emulate-intra-latency "${INTRA_US:-10}" \
  --json "$out/points.json" > "$out/bench.txt"
"$build/ringattn" plan --calibrate "$out/points.json" --same-run --check --tolerance "${TOLERANCE:-0.15}" \
  --json "$out/plan.json" | tee "$out/plan.txt"
