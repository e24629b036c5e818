#!/usr/bin/env bash
# `--auto` against a sweep of every configuration it chooses among, on the cluster in a box
# (docs/benchmarks.md, "Choosing the configuration: --auto"). For each link rate and node count (one rank per
# node): the attention job with every layout x schedule x Ulysses degree, then with --auto (the
# machine measured at start-up); netns_auto_report.py compares the measured time of --auto's
# choice with the fastest measured configuration.
#
#   OUT=netns_auto launch/cluster/netns_auto.sh        (as root; about 15 minutes on 2 cores)
#
# RATES (default "1gbit 100mbit"), NODES ("4 8"), RINGATTN (build/ringattn), JOB (the job's
# options: "--causal --seq-len 8192 --heads 4 --head-dim 64 --backward --threads 1"), TIMING
# ("--iters 3 --warmup 1"). The cluster is made here (RINGATTN_NETNS=auto$$) and removed on every
# way out.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
out=${OUT:-netns_auto}
exe=${RINGATTN:-$root/build/ringattn}
rates=${RATES:-"1gbit 100mbit"}
node_counts=${NODES:-"4 8"}
job=${JOB:-"--causal --seq-len 8192 --heads 4 --head-dim 64 --backward --threads 1"}
timing=${TIMING:-"--iters 3 --warmup 1"}
export RINGATTN_NETNS=${RINGATTN_NETNS:-auto$$}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
max=1
for n in $node_counts; do [ "$n" -gt "$max" ] && max=$n; done
heads=$(sed -n 's/.*--heads \([0-9]*\).*/\1/p' <<<"$job")
mkdir -p "$out"
trap '"$here/netns.sh" down >/dev/null' EXIT
"$here/netns.sh" up "$max" --rate "${rates%% *}"

for rate in $rates; do
  "$here/netns.sh" rate "$rate"
  for n in $node_counts; do
    for u in $(seq 1 "$n"); do
      [ $((n % u)) -eq 0 ] && [ $((heads % u)) -eq 0 ] || continue
      for layout in zigzag contiguous striped; do
        for schedule in direct ring; do
          name="$rate-$n-$layout-$schedule-$u"
          # shellcheck disable=SC2086
          "$here/netns.sh" mpirun -np "$n" "$exe" $job $timing --layout "$layout" --schedule "$schedule" \
            --ulysses "$u" --json "$out/$name.json" | sed -n "s/^  \(forward\|backward\) /$name \1 /p"
          [ "$u" -eq "$n" ] && break 2  # one group, no ring: layout and schedule change nothing
        done
      done
    done
    # shellcheck disable=SC2086
    "$here/netns.sh" mpirun -np "$n" "$exe" $job $timing --auto --json "$out/$rate-$n-auto.json" |
      tee "$out/$rate-$n-auto.txt" | sed -n '/auto/,/chose/p'
  done
done
/usr/bin/python3 "$here/netns_auto_report.py" "$out" | tee "$out/table.md"
