#!/usr/bin/env bash
# Configures and builds into build/ (Release): the ringattn program, the library and the Python
# module (build/python; `source launch/env.sh` puts it on PYTHONPATH). Extra arguments go to
# cmake's configure step.
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release "$@" >/dev/null
cmake --build build -j"$(nproc)"
