#!/usr/bin/env bash
# Sets up, builds, and runs the main job under mpirun with 2 ranks (RINGATTN_RANKS to change).
# Arguments go to ringattn; with none it runs the default self-checking job.
set -euo pipefail
cd "$(dirname "$0")/.."
launch/setup.sh
launch/build.sh
source launch/env.sh
ranks=${RINGATTN_RANKS:-2}
extra=()
[ "$(nproc)" -lt "$ranks" ] && extra+=(--oversubscribe)
exec mpirun -np "$ranks" "${extra[@]}" build/ringattn "$@"
