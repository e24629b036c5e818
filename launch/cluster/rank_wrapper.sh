#!/usr/bin/env bash
# Runs one rank of a cluster job: one GPU per rank. Unless the launcher already chose the rank's
# GPU (CUDA_VISIBLE_DEVICES set, as srun --gpus-per-task=1 does) or RINGATTN_GPU_BIND=0, the rank
# sees only the GPU of its local rank, so it uses device 0 whatever its rank. Then it runs the
# command: rank_wrapper.sh build/ringattn bench ...
local_rank=${OMPI_COMM_WORLD_LOCAL_RANK:-${SLURM_LOCALID:-${MPI_LOCALRANKID:-${PMI_LOCAL_RANK:-0}}}}
if [ "${RINGATTN_GPU_BIND:-1}" = 1 ] && [ -z "${CUDA_VISIBLE_DEVICES:-}" ] && command -v nvidia-smi >/dev/null 2>&1; then
  export CUDA_VISIBLE_DEVICES=$local_rank
fi
exec "$@"
