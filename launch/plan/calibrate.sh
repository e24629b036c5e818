#!/usr/bin/env bash
# Measures this machine with `ringattn bench` and checks the cluster model against it:
#   1. weak scaling, 1 -> 2 ranks (causal, zigzag, 8192 tokens per rank);
#   2. strong scaling, 1 -> 2 ranks, for a few masks and schedules;
#   3. 2 ranks over emulated links, from fast (compute hides every transfer) to slow (exposed);
# then `ringattn plan --calibrate` fits the model to 1 and 2 (no emulation) and compares its
# predictions with every point, the emulated ones included (--check: exit 3 when one misses by
# more than 15%). Run it on a quiet machine (check `uptime`). OUT (default calibration/) gets the
# JSON files, the tables, the fitted machine (machine.json, a --cluster file) and plots.
# ITERS (default 5) timed iterations per point; THREADS (default 1) per rank.
set -euo pipefail
cd "$(dirname "$0")/../.."
source launch/env.sh
out=${OUT:-calibration}
mkdir -p "$out"
common=(--threads "${THREADS:-1}" --iters "${ITERS:-5}" --warmup 1)
bench() {  # bench NAME ARGS...: 2 ranks, table to NAME.txt, points to NAME.json
  local name=$1
  shift
  mpirun -np 2 build/ringattn bench "${common[@]}" --json "$out/$name.json" "$@" | tee "$out/$name.txt"
}
uptime | tee "$out/load.txt"
bench weak --mode weak --tokens-per-rank 8192 --causal
bench strong_causal --seq-len 8192 --causal
bench strong_full --seq-len 8192
bench strong_causal_ring --seq-len 8192 --causal --schedule ring
bench strong_window --seq-len 16384 --causal --window 2048,-1 --layout contiguous
measured=$(ls "$out"/{weak,strong_*}.json | paste -sd,)
# A step computes a 2048 x 2048 block (~80 ms at 200 GFLOP/s) while 16 MiB of K/V travel: the
# transfer hides above ~0.2 GB/s and is exposed below.
for gbps in 2 0.5 0.25 0.15 0.1 0.05 0.025; do
  bench "emulated_${gbps}" --ranks 2 --seq-len 4096 --emulate-bandwidth "$gbps" --emulate-latency 50
done
uptime | tee -a "$out/load.txt"
rc=0
build/ringattn plan --calibrate "$measured" --validate "$(ls "$out"/{weak,strong_*,emulated_*}.json | paste -sd,)" \
  --check --save-calibration "$out/machine.json" --json "$out/plan.json" > "$out/plan.txt" || rc=$?
cat "$out/plan.txt"
python3 launch/bench/plot_scaling.py "$out/weak.json" "$out/strong_causal.json" "$out/strong_full.json" -o "$out/scaling.png" || true
python3 launch/bench/plot_scaling.py "$out"/emulated_*.json --plan "$out/plan.json" -o "$out/emulated.png" || true
exit $rc
