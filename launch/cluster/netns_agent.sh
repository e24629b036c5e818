#!/usr/bin/env bash
# mpirun's remote shell for the cluster in a box (netns.sh sets plm_rsh_agent to it): called as
# `netns_agent.sh [options] HOST COMMAND...` like ssh, it runs COMMAND in the namespace of the node
# whose management address is HOST, in a UTS namespace of its own named after the node, so that the
# daemon (and Open MPI's node detection) sees a host of its own. RINGATTN_NETNS_STATE: the
# cluster's state folder (netns.sh sets it).
set -euo pipefail
while [ $# -gt 0 ] && [ "${1#-}" != "$1" ]; do shift; done  # ssh-style options: none apply
host=${1:?netns_agent.sh: no host}
shift
ns=$(awk -v h="$host" '$1 == h { print $2 }' "${RINGATTN_NETNS_STATE:?netns_agent.sh: RINGATTN_NETNS_STATE unset}/nodes")
[ -n "$ns" ] || { echo "netns_agent.sh: $host is not a node of $RINGATTN_NETNS_STATE" >&2; exit 255; }
# As ssh does: the words form one command line for a shell.
exec ip netns exec "$ns" unshare --uts /bin/sh -c 'hostname "$1" && eval "$2"' sh "$ns" "$*"
