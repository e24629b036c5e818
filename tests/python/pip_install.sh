#!/usr/bin/env bash
# `pip install .` as a user runs it, without the network: a wheel built from the source tree
# (pyproject.toml: scikit-build-core over the CMake build; the CPU backend, as the build here must
# stay short), installed into a fresh venv that sees no system package and no environment script:
#   - `import ringattn` from outside the source tree, with numpy and mpi4py as the wheel declares them;
#   - the `ringattn` command the wheel puts in the venv's bin/, under mpirun -np 2 (--check);
#   - the Python example (python/examples/example.py, PyTorch) under mpirun -np 2, the same wheel
#     installed into a second venv that sees the system's PyTorch (the wheel does not declare it).
# Usage: pip_install.sh SOURCE WORK WHEELS -- MPIEXEC -np 2 [FLAGS...]
# WHEELS: what pip takes from PyPI (launch/setup.sh fills build/wheels). WORK/cmake keeps the
# wheel's CMake build, so a rerun compiles only what changed; with ccache, a fresh WORK too.
set -euo pipefail
mkdir -p "$2"
src=$(cd "$1" && pwd) work=$(cd "$2" && pwd) wheels=$(cd "$3" 2>/dev/null && pwd || echo "$3")
shift 3
[ "${1:-}" = "--" ] && shift
mpi=("$@")
[ -f "$wheels/.complete" ] || { echo "$wheels: the wheels pip needs are missing: run launch/setup.sh"; exit 1; }

export PIP_NO_INDEX=1 PIP_FIND_LINKS=$wheels PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1
export CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-2}
# ccache (launch/setup.sh), shared by the machine's checkouts, paths taken relative to the source
# tree: a fresh checkout of unchanged sources (as CI's) compiles nothing again.
launcher=()
if command -v ccache >/dev/null; then
  export CCACHE_DIR=${RINGATTN_CCACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/ringattn/ccache} CCACHE_BASEDIR=$src
  export CCACHE_MAXSIZE=${CCACHE_MAXSIZE:-2G}
  launcher=(--config-settings=cmake.define.CMAKE_CXX_COMPILER_LAUNCHER=ccache
            --config-settings=cmake.define.CMAKE_C_COMPILER_LAUNCHER=ccache)
fi
unset PYTHONPATH LD_LIBRARY_PATH
rm -rf "$work/dist" "$work/venv" "$work/venv-torch"
cd "$work"

/usr/bin/python3 -m venv venv
venv/bin/pip wheel -q --no-deps -w dist --config-settings=build-dir="$work/cmake" \
  --config-settings=cmake.define.RINGATTN_CUDA=OFF "${launcher[@]}" "$src"
wheel=$(ls dist/ringattn-*.whl)
echo "built $wheel"
venv/bin/pip install -q "$wheel"
venv/bin/python - <<'PY'
import os, ringattn
where = os.path.dirname(ringattn.__file__)
assert where.startswith(os.path.abspath("venv")), "ringattn imported from %s, not from the venv" % where
print("import ringattn %s from %s" % (ringattn.version(), where))
PY
"${mpi[@]}" venv/bin/ringattn attention --seq-len 300 --heads 2 --head-dim 32 --causal --check

/usr/bin/python3 -m venv --system-site-packages venv-torch
venv-torch/bin/pip install -q --no-deps "$wheel"
"${mpi[@]}" venv-torch/bin/python "$src/python/examples/example.py"
echo "pip install: PASSED"
