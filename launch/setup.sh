#!/usr/bin/env bash
# Installs every Debian package the build, the tests and the main job need. Idempotent and quick
# when everything is present. The CUDA toolkit (nvcc, NCCL) is optional and not installed here:
# when present, the GPU path is built as well.
set -euo pipefail

packages=(
  build-essential cmake pkg-config        # compilers and the build
  openmpi-bin libopenmpi-dev              # MPI: mpirun, mpi.h
  libboost-program-options-dev            # the command line
  libopenblas-dev                         # sgemm for the LoRA projections and the benchmark yardstick
  googletest libgtest-dev                 # the tests
  clang libclang-rt-14-dev                # the libFuzzer target of the .npy reader (tests)
  python3 python3-matplotlib python3-numpy  # launch/bench/plot_scaling.py and file examples
  python3-venv                            # build/pyenv: the safetensors package for the layer tests
  python3-dev pybind11-dev python3-pybind11  # the Python module ringattn (build/python)
  python3-torch python3-mpi4py            # its tests and examples (PyTorch, mpi4py communicators)
  iproute2                                # launch/cluster/netns.sh: the cluster in a box (ip netns, tc)
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "launch/setup.sh: installing ${missing[*]}"
  sudo=""
  if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null || { echo "launch/setup.sh: need root or sudo to install ${missing[*]}" >&2; exit 1; }
    sudo="sudo"
  fi
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -qq
  $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# The safetensors package (small, not in Debian 12) in a venv over the system's NumPy: the layer
# tests write their checkpoints and adapters with it. Best effort: without network the tests that
# need it are not registered (CMake looks for build/pyenv/bin/python).
cd "$(dirname "$0")/.."
if ! build/pyenv/bin/python -c "import safetensors.numpy" 2>/dev/null; then
  /usr/bin/python3 -m venv --system-site-packages build/pyenv &&
    build/pyenv/bin/pip install -q safetensors ||
    echo "launch/setup.sh: could not install safetensors into build/pyenv (its tests are skipped)" >&2
fi
