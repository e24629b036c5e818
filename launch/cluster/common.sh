# Sourced by the cluster launch scripts: what every rank's environment needs.

# The rank counts of a sweep's first launch (one node): 1, 2, 4, ... up to the node's ranks.
ranks_within_node() {
  local per_node=$1 p=1 list=""
  while [ "$p" -lt "$per_node" ]; do list="$list$p,"; p=$((p * 2)); done
  echo "$list$per_node"
}

# This node's physical cores (what mpirun's --map-by ...:PE=N counts), at most the CPUs this
# process may use.
physical_cores() {
  local cores
  cores=$(lscpu -p=CORE,SOCKET 2>/dev/null | grep -v '^#' | sort -u | wc -l)
  if [ "$cores" -ge 1 ] && [ "$cores" -le "$(nproc)" ]; then echo "$cores"; else nproc; fi
}

# OpenMP threads bound to the rank's own cores (the launcher binds the rank to them).
export_thread_binding() {
  local threads=$1
  export OMP_NUM_THREADS=${OMP_NUM_THREADS:-$threads}
  export OMP_PROC_BIND=${OMP_PROC_BIND:-close} OMP_PLACES=${OMP_PLACES:-cores}
}

# Open MPI's -x for every NCCL_, RINGATTN_, OMP_, UCX_ and CUDA_ variable set here, so that the
# ranks on other nodes see them too (srun exports the whole environment by itself).
passthrough_args() {
  local name
  for name in $(env | grep -oE '^(NCCL|RINGATTN|OMP|UCX|CUDA)_[A-Za-z0-9_]*' | sort -u); do
    printf -- '-x\n%s\n' "$name"
  done
}
