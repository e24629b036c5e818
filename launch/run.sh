#!/usr/bin/env bash
# Sets up what the program needs (launch/setup.sh --main), builds the ringattn program alone
# (Release, build/; no tests), and runs the main job under mpirun with 2 ranks (RINGATTN_RANKS to
# change). Arguments go to ringattn; with none it runs the default self-checking job.
set -euo pipefail
cd "$(dirname "$0")/.."
launch/setup.sh --main
# A first configuration leaves out the tests, and the CUDA backend unless a GPU is visible (the
# main job runs on the CPU otherwise); a build/ already configured (launch/build.sh,
# launch/test.sh) keeps its configuration.
if [ ! -f build/CMakeCache.txt ]; then
  cuda=OFF
  command -v nvcc >/dev/null && nvidia-smi -L >/dev/null 2>&1 && cuda=ON
  cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DRINGATTN_TESTS=OFF -DRINGATTN_CUDA=$cuda >/dev/null
fi
cmake --build build -j"$(nproc)" --target ringattn
source launch/env.sh
ranks=${RINGATTN_RANKS:-2}
# Each rank on cores of its own, a thread on each of their CPUs (README "Threads and binding");
# PE counts physical cores. With fewer cores than ranks, the ranks share them unbound.
cores=$(lscpu -p=CORE,SOCKET 2>/dev/null | grep -v '^#' | sort -u | wc -l)
[ "$cores" -ge 1 ] && [ "$cores" -le "$(nproc)" ] || cores=$(nproc)
if [ "$cores" -ge "$ranks" ]; then
  mapping=(--map-by "slot:PE=$((cores / ranks))" --bind-to core)
else
  mapping=(--oversubscribe --bind-to none)
fi
exec mpirun -np "$ranks" "${mapping[@]}" build/ringattn "$@"
