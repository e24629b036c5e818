#!/usr/bin/env bash
# Scaling sweep across nodes with mpirun: for each node count in NODES, GPUS_PER_NODE ranks per
# node (one per GPU, each bound to its share of the node's cores), one `ringattn bench` launch;
# the first launch (one node) also sweeps 1, 2, 4, ... ranks within the node. Every point goes
# into OUT/bench_sweep.json (efficiency relative to the smallest point) and OUT/scaling.png.
#
#   HOSTFILE=hosts GPUS_PER_NODE=8 NODES="1 2 4 8" OUT=sweep launch/cluster/mpirun_sweep.sh \
#       --mode strong --seq-len 1048576 --causal --heads 32 --kv-heads 8 --dtype bf16
#
# HOSTFILE: one host per line (the first word of each line; '#' lines skipped). Extra arguments
# go to `ringattn bench`. NCCL_*, RINGATTN_*, OMP_*, UCX_* and CUDA_* variables set when this
# runs reach every rank. RINGATTN (the executable, default build/ringattn, the same path on
# every node), CPUS_PER_RANK (default: this node's physical cores / GPUS_PER_NODE; each rank
# runs that many threads, README "Threads and binding"), MPIRUN_ARGS (more
# mpirun options, e.g. "--mca btl_tcp_if_include ib0").
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
source "$root/launch/env.sh"
source "$here/common.sh"
: "${HOSTFILE:?set HOSTFILE to a file with one host per line}"
per_node=${GPUS_PER_NODE:-8}
node_counts=${NODES:-"1 2 4 8"}
out=${OUT:-sweep}
exe=${RINGATTN:-$root/build/ringattn}
cores=$(physical_cores)
cpus=${CPUS_PER_RANK:-$(( cores / per_node > 0 ? cores / per_node : 1 ))}
mapfile -t hosts < <(grep -vE '^[[:space:]]*(#|$)' "$HOSTFILE" | awk '{print $1}')
export_thread_binding "$cpus"
mapfile -t pass < <(passthrough_args)
mkdir -p "$out"

files=()
for n in $node_counts; do
  if [ "$n" -gt "${#hosts[@]}" ]; then
    echo "mpirun_sweep.sh: skipping $n nodes: $HOSTFILE lists ${#hosts[@]}" >&2
    continue
  fi
  P=$((n * per_node))
  host_list=$(printf "%s:$per_node," "${hosts[@]:0:$n}")
  ranks=$P
  [ "$n" -eq 1 ] && ranks=$(ranks_within_node "$per_node")
  extra=()
  [ "$P" -gt "$(nproc)" ] && [ "$n" -eq 1 ] && extra+=(--oversubscribe)
  # shellcheck disable=SC2086
  mpirun -np "$P" --host "${host_list%,}" --map-by "ppr:$per_node:node:PE=$cpus" --bind-to core "${extra[@]}" \
    "${pass[@]}" ${MPIRUN_ARGS:-} "$here/rank_wrapper.sh" "$exe" bench --ranks "$ranks" \
    --json "$out/bench_${n}nodes.json" "$@" | tee "$out/bench_${n}nodes.txt"
  files+=("$out/bench_${n}nodes.json")
done
[ ${#files[@]} -gt 0 ] || { echo "mpirun_sweep.sh: nothing ran" >&2; exit 2; }
python3 "$here/merge_bench.py" "${files[@]}" -o "$out/bench_sweep.json"
python3 "$root/launch/bench/plot_scaling.py" "$out/bench_sweep.json" -o "$out/scaling.png" || true
