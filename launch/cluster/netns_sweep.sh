#!/usr/bin/env bash
# The scaling sweep on the cluster in a box (README "Scaling on the cluster in a box"): for each
# link rate, `ringattn bench` over 1, 2, 4, 8 nodes: weak scaling and strong scaling with one rank
# per node, and the hybrid (--ulysses 2) with two ranks per node. Each timed run is followed by a
# forward pass alone (no check), whose bytes on the wire (the nodes' veth counters) are compared
# with its comm_bytes_sent. Then `ringattn plan --same-run` predicts every point over the link
# (the rate's TCP payload rate), and netns_report.py writes the table and the plot.
#
#   OUT=netns_sweep launch/cluster/netns_sweep.sh        (as root; about 10 minutes on 2 cores)
#
# RATES (default "1gbit 100mbit"), NODES ("1 2 4 8"), HYBRID_NODES ("1 2 4"), RINGATTN (build/ringattn),
# WEAK, STRONG, HYBRID (the bench options of each series), COMMON (options of all), TIMING (of the
# timed runs: "--iters 3 --warmup 1"), LATENCY_US (per
# rate, "RATE=US ...": the link latency the plan assumes; default the round trip of a small
# message while the link is busy, measured once here: 1gbit=1400 100mbit=6500). The cluster is
# made here (RINGATTN_NETNS=sweep$$) and removed on every way out.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
out=${OUT:-netns_sweep}
exe=${RINGATTN:-$root/build/ringattn}
rates=${RATES:-"1gbit 100mbit"}
node_counts=${NODES:-"1 2 4 8"}
hybrid_nodes=${HYBRID_NODES:-"1 2 4"}
common=${COMMON:-"--causal --heads 4 --head-dim 64 --threads 1"}
timing=${TIMING:-"--iters 3 --warmup 1"}
weak=${WEAK:-"--mode weak --tokens-per-rank 2048"}
strong=${STRONG:-"--mode strong --seq-len 8192"}
hybrid=${HYBRID:-"--mode strong --seq-len 8192 --ulysses 2"}
latency=${LATENCY_US:-"1gbit=1400 100mbit=6500"}
export RINGATTN_NETNS=${RINGATTN_NETNS:-sweep$$}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
max=1
for n in $node_counts $hybrid_nodes; do [ "$n" -gt "$max" ] && max=$n; done
mkdir -p "$out"
trap '"$here/netns.sh" down >/dev/null' EXIT
"$here/netns.sh" up "$max" --rate "${rates%% *}"
source "/run/ringattn-netns/$RINGATTN_NETNS/config"
slot=$CLUSTER_SLOT

sent_by_nodes() {  # bytes each node has sent on its data link, summed
  local s=0 i
  for i in $(seq 0 $((max - 1))); do s=$((s + $(cat "/sys/class/net/ra${slot}d$i/statistics/rx_bytes"))); done
  echo "$s"
}

# run NAME NODES RANKS MPIRUN_ARGS -- BENCH_ARGS: the timed run, then the forward alone with its wire bytes.
run() {
  local name=$1 n=$2 p=$3 map=$4
  shift 4
  # shellcheck disable=SC2086
  "$here/netns.sh" mpirun -np "$p" $map "$exe" bench --ranks "$p" "$@" $timing --json "$out/$name.json" |
    grep -v '^#' | sed "s/^/$name /"
  local before after
  before=$(sent_by_nodes)
  # shellcheck disable=SC2086
  "$here/netns.sh" mpirun -np "$p" $map "$exe" bench --ranks "$p" "$@" --forward-only --iters 1 --warmup 0 \
    --no-check --json "$out/$name.bytes.json" >/dev/null
  after=$(sent_by_nodes)
  echo "{\"wire_bytes\": $((after - before)), \"nodes\": $n}" >"$out/$name.wire.json"
}

for rate in $rates; do
  "$here/netns.sh" rate "$rate"
  for n in $node_counts; do
    # shellcheck disable=SC2086
    run "$rate-weak-$n" "$n" "$n" "" $common $weak
    # shellcheck disable=SC2086
    run "$rate-strong-$n" "$n" "$n" "" $common $strong
  done
  for n in $hybrid_nodes; do
    # shellcheck disable=SC2086
    run "$rate-hybrid-$n" "$n" $((2 * n)) "--map-by ppr:2:node" $common $hybrid
  done
  # The link as the plan sees it: TCP's payload rate (1448 bytes of every 1514-byte frame that tbf
  # counts at MTU 1500) and the latency given for this rate.
  source "/run/ringattn-netns/$RINGATTN_NETNS/config"
  gbps=$(awk -v b="$CLUSTER_RATE_BYTES" 'BEGIN { printf "%.6g", b * 1448 / 1514 / 1e9 }')
  us=$(tr ' ' '\n' <<<"$latency" | sed -n "s/^$rate=//p")
  files=$(ls "$out/$rate"-*-[0-9].json "$out/$rate"-*-[0-9][0-9].json 2>/dev/null | paste -sd, || true)
  "$exe" plan --calibrate "$files" --same-run --machine-inter-bandwidth "$gbps" \
    --machine-inter-latency "${us:-100}" --json "$out/$rate-plan.json" | tee "$out/$rate-plan.txt"
done
/usr/bin/python3 "$here/netns_report.py" "$out" -o "$out/netns_scaling.png" | tee "$out/table.md"
