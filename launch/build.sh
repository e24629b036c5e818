#!/usr/bin/env bash
# Configures and builds everything into build/ (Release): the ringattn program, the library, the
# Python module (build/python; `source launch/env.sh` puts it on PYTHONPATH) and the tests (needs
# launch/setup.sh's test set). Extra arguments go to cmake's configure step.
set -euo pipefail
cd "$(dirname "$0")/.."
# Explicit, so that a build/ first configured by launch/run.sh (the program alone) gains the tests
# and the CUDA backend (when nvcc and NCCL are found).
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DRINGATTN_TESTS=ON -DRINGATTN_CUDA=ON "$@" >/dev/null
cmake --build build -j"$(nproc)"
