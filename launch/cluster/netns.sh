#!/usr/bin/env bash
# A cluster in a box: N network namespaces on this machine as N nodes, joined by real TCP.
#
#   launch/cluster/netns.sh up N [--rate RATE]     make the nodes (links capped at RATE, e.g. 1gbit)
#   launch/cluster/netns.sh mpirun [mpirun options] PROGRAM ...
#                                                  mpirun across them (one rank per node unless told)
#   launch/cluster/netns.sh down                   remove everything `up` made
#   launch/cluster/netns.sh run COMMAND ...        COMMAND with HOSTFILE and Open MPI's settings for
#                                                  the nodes (e.g. launch/cluster/mpirun_sweep.sh)
#   launch/cluster/netns.sh exec NODE COMMAND ...  COMMAND inside node NODE (0 .. N-1)
#   launch/cluster/netns.sh rate RATE [NODE ...]   change the cap (all nodes by default)
#   launch/cluster/netns.sh status                 what `up` made
#
# Each node is a namespace with two links, each a veth pair to a bridge on the host: `data0`,
# capped at RATE in both directions by tbf (MPI's byte transport: btl_tcp_if_include), and
# `mgmt0`, unshaped (mpirun's daemons: oob_tcp_if_include; the host's end of the management bridge
# holds the one address outside the namespaces, where mpirun listens). Addresses come from
# 198.18.0.0/15, the range set aside for benchmark networks: data on 198.18.S.0/24, management on
# 198.19.S.0/24, S a free slot. The namespaces have no default route, so nothing leaves them but
# to each other and to the management bridge's address. mpirun starts its daemons through
# netns_agent.sh (plm_rsh_agent), which enters the node's namespace and gives the daemon a UTS
# namespace and host name of its own, so Open MPI and MPI_Comm_split_type see N nodes; ranks of
# one node use shared memory. The hostfile lists the nodes' management addresses: no name
# resolution, /etc/hosts untouched.
#
# Needs root and iproute2. RINGATTN_NETNS=NAME picks the cluster (default "ringattn"), so that
# several can exist at once; its state (what `up` made, which `down` removes) is under
# /run/ringattn-netns/NAME.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
name=${RINGATTN_NETNS:-ringattn}
state_root=/run/ringattn-netns
dir=$state_root/$name
state=$dir/config  # CLUSTER_NODES, CLUSTER_SLOT, CLUSTER_RATE, CLUSTER_RATE_BYTES (bytes/s; sourced)
made=$dir/made     # what up made, one per line, in order

die() {
  echo "netns.sh: $*" >&2
  exit 2
}

usage() {
  sed -n '3,13p' "$0" | sed 's/^# \{0,1\}//' >&2
  exit 2
}

[[ $name =~ ^[A-Za-z0-9][A-Za-z0-9_.-]{0,23}$ ]] || die "RINGATTN_NETNS=$name: letters, digits, '_', '.', '-' (at most 24)"

need_root() {
  [ "$(id -u)" -eq 0 ] || die "needs root (network namespaces, veth pairs, tc)"
  command -v ip >/dev/null && command -v tc >/dev/null || die "needs iproute2 (ip, tc): launch/setup.sh installs it"
}

load_state() {
  [ -f "$state" ] || die "no cluster '$name' (run: launch/cluster/netns.sh up N)"
  # shellcheck source=/dev/null
  source "$state"
}

# tc's rate (e.g. 1gbit, 100mbit, 500kbit, 10mbps) in bytes per second.
rate_bytes() {
  local r=${1,,} n unit
  [[ $r =~ ^([0-9]+(\.[0-9]+)?)([kmgt]?)(bit|bps)$ ]] || die "--rate $1: expected a number and a unit such as 1gbit, 100mbit, 10mbps"
  n=${BASH_REMATCH[1]} unit=${BASH_REMATCH[3]}
  awk -v n="$n" -v u="$unit" -v b="${BASH_REMATCH[4]}" 'BEGIN {
    m = (u == "k") ? 1e3 : (u == "m") ? 1e6 : (u == "g") ? 1e9 : (u == "t") ? 1e12 : 1
    printf "%.0f\n", (b == "bit") ? n * m / 8 : n * m }'
}

# Caps device $2 (in namespace $1, or on the host when $1 is empty) at rate $3: a token bucket of
# 2 ms worth of bytes (at least 64 KiB, so a GSO packet fits) and a queue of 50 ms.
shape() {
  local ns=$1 dev=$2 rate=$3 bytes burst
  bytes=$(rate_bytes "$rate")
  burst=$((bytes / 500 > 65536 ? bytes / 500 : 65536))
  local cmd=(tc qdisc replace dev "$dev" root tbf rate "$rate" burst "$burst" latency 50ms)
  if [ -n "$ns" ]; then ip netns exec "$ns" "${cmd[@]}"; else "${cmd[@]}"; fi
}

# One free slot S (198.18.S.0/24 and 198.19.S.0/24 unused, no state names it), under the lock.
free_slot() {
  local s used
  used=$(cat "$state_root"/*/slot 2>/dev/null || true)
  for s in $(seq 0 255); do
    grep -qx "$s" <<<"$used" && continue
    ip -o -4 addr show | grep -qE " 198\.1[89]\.$s\." && continue
    ip link show "ra${s}d" >/dev/null 2>&1 && continue
    echo "$s"
    return
  done
  die "no free slot in 198.18.0.0/15"
}

record() { echo "$1" >>"$made"; }

write_config() {
  local bytes=0
  [ "$3" = none ] || bytes=$(rate_bytes "$3")
  echo "CLUSTER_NODES=$1 CLUSTER_SLOT=$2 CLUSTER_RATE=$3 CLUSTER_RATE_BYTES=$bytes" >"$state"
}

cmd_up() {
  local n=${1:-} rate=""
  shift || true
  [[ $n =~ ^[0-9]+$ ]] && [ "$n" -ge 1 ] && [ "$n" -le 250 ] || die "up N: N must be 1 .. 250 (got '${n}')"
  while [ $# -gt 0 ]; do
    case $1 in
      --rate) rate=${2:?--rate needs a value}; shift 2 ;;
      --rate=*) rate=${1#--rate=}; shift ;;
      *) die "up: unknown option '$1'" ;;
    esac
  done
  [ -z "$rate" ] || rate_bytes "$rate" >/dev/null
  need_root
  mkdir -p "$state_root"
  exec 9>"$state_root/.lock"
  flock 9
  [ ! -e "$dir" ] || die "cluster '$name' exists already (launch/cluster/netns.sh down removes it)"
  mkdir -p "$dir"
  local slot
  slot=$(free_slot)
  echo "$slot" >"$dir/slot"
  echo "# launch/cluster/netns.sh up $n${rate:+ --rate $rate}: what down removes, in reverse" >"$made"
  write_config "$n" "$slot" "${rate:-none}"
  trap 'echo "netns.sh: up failed; removing what it made" >&2; cmd_down >/dev/null 2>&1 || true' ERR
  local data_br=ra${slot}d mgmt_br=ra${slot}m i ns
  ip link add "$data_br" type bridge && record "LINK $data_br"
  ip link add "$mgmt_br" type bridge && record "LINK $mgmt_br"
  for br in "$data_br" "$mgmt_br"; do
    echo 1 >"/proc/sys/net/ipv6/conf/$br/disable_ipv6" 2>/dev/null || true
  done
  ip addr add "198.19.$slot.1/24" dev "$mgmt_br"
  ip link set "$data_br" up
  ip link set "$mgmt_br" up
  : >"$dir/hostfile"
  : >"$dir/nodes"
  for i in $(seq 0 $((n - 1))); do
    ns=$name-$i
    ip netns add "$ns" && record "NETNS $ns"
    ip netns exec "$ns" sysctl -qw net.ipv6.conf.all.disable_ipv6=1 net.ipv6.conf.default.disable_ipv6=1
    ip netns exec "$ns" ip link set lo up
    ip link add "ra${slot}d$i" type veth peer name data0 netns "$ns" && record "LINK ra${slot}d$i"
    ip link add "ra${slot}m$i" type veth peer name mgmt0 netns "$ns" && record "LINK ra${slot}m$i"
    for dev in "ra${slot}d$i" "ra${slot}m$i"; do
      echo 1 >"/proc/sys/net/ipv6/conf/$dev/disable_ipv6" 2>/dev/null || true
    done
    ip link set "ra${slot}d$i" master "$data_br" up
    ip link set "ra${slot}m$i" master "$mgmt_br" up
    ip netns exec "$ns" ip addr add "198.18.$slot.$((i + 10))/24" dev data0
    ip netns exec "$ns" ip addr add "198.19.$slot.$((i + 10))/24" dev mgmt0
    ip netns exec "$ns" ip link set data0 up
    ip netns exec "$ns" ip link set mgmt0 up
    if [ -n "$rate" ]; then
      shape "$ns" data0 "$rate"             # what the node sends
      shape "" "ra${slot}d$i" "$rate"       # what it receives
    fi
    echo "198.19.$slot.$((i + 10)) slots=64" >>"$dir/hostfile"
    echo "198.19.$slot.$((i + 10)) $ns ra${slot}d$i" >>"$dir/nodes"
  done
  trap - ERR
  record "UP"
  echo "netns.sh: cluster '$name': $n node$([ "$n" -gt 1 ] && echo s)${rate:+, links capped at $rate}; hostfile $dir/hostfile"
}

# Removes what the state file lists (in reverse), ending any process left in the namespaces.
cmd_down() {
  need_root
  [ -f "$made" ] || { [ -d "$dir" ] && rm -rf "$dir"; echo "netns.sh: no cluster '$name'"; return 0; }
  local kind obj pids ns
  mapfile -t lines < <(grep -E '^(NETNS|LINK) ' "$made" | tac)
  for line in "${lines[@]}"; do
    read -r kind obj <<<"$line"
    [ "$kind" = NETNS ] || continue
    pids=$(ip netns pids "$obj" 2>/dev/null || true)
    if [ -n "$pids" ]; then
      echo "netns.sh: ending processes left in $obj: $(echo $pids)" >&2
      kill -TERM $pids 2>/dev/null || true
      for _ in $(seq 30); do
        [ -z "$(ip netns pids "$obj" 2>/dev/null)" ] && break
        sleep 0.1
      done
      pids=$(ip netns pids "$obj" 2>/dev/null || true)
      [ -z "$pids" ] || kill -KILL $pids 2>/dev/null || true
    fi
  done
  for line in "${lines[@]}"; do
    read -r kind obj <<<"$line"
    case $kind in
      LINK) ! ip link show "$obj" >/dev/null 2>&1 || ip link del "$obj" ;;
      NETNS) ! ip netns list | grep -qw "^$obj" || ip netns del "$obj" ;;
    esac
  done
  rm -rf "$dir"
  echo "netns.sh: cluster '$name' removed"
}

# Open MPI's settings for the nodes, as variables (mpirun reads OMPI_MCA_*; the agent reads the state).
cluster_env() {
  export HOSTFILE=$dir/hostfile RINGATTN_NETNS_STATE=$dir
  export OMPI_MCA_plm_rsh_agent=$here/netns_agent.sh OMPI_MCA_plm_rsh_no_tree_spawn=1
  export OMPI_MCA_oob_tcp_if_include=198.19.$CLUSTER_SLOT.0/24 OMPI_MCA_btl_tcp_if_include=198.18.$CLUSTER_SLOT.0/24
  export OMPI_MCA_btl=${OMPI_MCA_btl:-self,vader,tcp}
}

cmd_mpirun() {
  load_state
  cluster_env
  # One rank per node unless told otherwise; the nodes share this machine's cores, so binding
  # each node's ranks to "its" cores would stack them on the same ones: unbound unless told.
  local arg prev="" np="" map=1 bind=1
  for arg in "$@"; do
    case $prev in -np | -n | --np | -c) np=$arg ;; esac
    case $arg in
      --map-by | --npernode | -npernode | -N | --ppr | -ppr | --bynode | --byslot) map=0 ;;
      --bind-to | --bind-to=*) bind=0 ;;
    esac
    prev=$arg
  done
  local extra=()
  [ -n "$np" ] || extra+=(-np "$CLUSTER_NODES")
  # More ranks than this machine has cores: a rank waiting for data sleeps between polls rather
  # than spin (comm/mpi_communicator.cpp), leaving the cores to the ranks that compute; each
  # node alone would not know that the others share its cores.
  local ranks=${np:-$CLUSTER_NODES}
  if [[ $ranks =~ ^[0-9]+$ ]] && [ "$ranks" -gt "$(nproc)" ]; then
    export RINGATTN_OVERSUBSCRIBED=${RINGATTN_OVERSUBSCRIBED:-1}
  fi
  [ "$map" = 0 ] || extra+=(--map-by node)
  [ "$bind" = 0 ] || extra+=(--bind-to none)
  exec mpirun --hostfile "$HOSTFILE" "${extra[@]}" "$@"
}

node_ns() {
  [[ ${1:-} =~ ^[0-9]+$ ]] && [ "$1" -lt "$CLUSTER_NODES" ] || die "node '${1:-}': expected 0 .. $((CLUSTER_NODES - 1))"
  echo "$name-$1"
}

cmd=${1:-}
shift || true
case $cmd in
  up) cmd_up "$@" ;;
  down) cmd_down ;;
  mpirun) cmd_mpirun "$@" ;;
  run)
    load_state
    cluster_env
    exec "$@"
    ;;
  exec)
    need_root
    load_state
    ns=$(node_ns "${1:-}")
    shift
    exec ip netns exec "$ns" "$@"
    ;;
  rate)
    need_root
    load_state
    new=${1:?rate RATE [NODE ...]}
    shift
    rate_bytes "$new" >/dev/null
    nodes=("$@")
    [ ${#nodes[@]} -gt 0 ] || mapfile -t nodes < <(seq 0 $((CLUSTER_NODES - 1)))
    for i in "${nodes[@]}"; do
      shape "$(node_ns "$i")" data0 "$new"
      shape "" "ra${CLUSTER_SLOT}d$i" "$new"
    done
    [ $# -gt 0 ] || write_config "$CLUSTER_NODES" "$CLUSTER_SLOT" "$new"
    ;;
  status)
    load_state
    cat "$state" "$made"
    echo "hostfile $dir/hostfile:"
    cat "$dir/hostfile"
    ;;
  *) usage ;;
esac
