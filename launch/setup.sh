#!/usr/bin/env bash
# Installs what the build, the main job and the tests need. Idempotent and quick when everything
# is present. Two sets (launch/setup.sh --help):
#   --main   what the ringattn program needs to build and run (launch/run.sh);
#   --tests  (default) that, and everything the tests use (launch/test.sh).
# The CUDA toolkit (nvcc, NCCL) is optional and never installed here: when present, the GPU path
# is built as well.
set -euo pipefail

usage() {
  cat <<'EOF'
usage: launch/setup.sh [--main | --tests]

  --main   the ringattn program (launch/run.sh): Debian's compilers, CMake, Open MPI,
           Boost.Program_options and OpenBLAS; with a visible GPU and nvcc, also the
           cudnn-frontend headers (build/third_party) for cuDNN's fused attention.
  --tests  (the default; launch/test.sh) all of --main, and for the tests: GoogleTest, clang
           (the fuzzer), NumPy, matplotlib, python3-dev and pybind11 (the Python module),
           Debian's PyTorch and mpi4py, ccache, iproute2 (the cluster in a box); venvs under
           build/: pyenv (safetensors), hfenv (PyTorch 2 and transformers, about 4.5 GB, kept
           once per machine under ~/.cache/ringattn); the cudnn-frontend headers; the wheels
           that `pip install .`'s test installs from (build/wheels).
EOF
}

set_name=tests
case "${1:-}" in
  --main) set_name=main ;;
  --tests | "") set_name=tests ;;
  -h | --help) usage; exit 0 ;;
  *) echo "launch/setup.sh: unknown argument '$1'" >&2; usage >&2; exit 2 ;;
esac

main_packages=(
  build-essential cmake pkg-config        # compilers and the build
  openmpi-bin libopenmpi-dev              # MPI: mpirun, mpi.h
  libboost-program-options-dev            # the command line
  libopenblas-dev                         # sgemm for the LoRA projections and the benchmark yardstick
)
test_packages=(
  googletest libgtest-dev                 # the tests
  clang libclang-rt-14-dev                # the libFuzzer targets of the .npy and safetensors readers
  python3 python3-matplotlib python3-numpy  # launch/bench/plot_scaling.py and file examples
  python3-venv                            # build/pyenv: the safetensors package for the layer tests
  python3-dev pybind11-dev python3-pybind11  # the Python module ringattn (build/python)
  ccache                                  # the pip install test's wheel build, cached across checkouts
  python3-torch python3-mpi4py            # its tests and examples (PyTorch, mpi4py communicators)
  iproute2                                # launch/cluster/netns.sh: the cluster in a box (ip netns, tc)
)

# A GPU the main job would run on: then it needs the cuDNN path's headers, fetched with pip.
gpu_visible() { command -v nvcc >/dev/null && nvidia-smi -L >/dev/null 2>&1; }

packages=("${main_packages[@]}")
if [ "$set_name" = tests ]; then
  packages+=("${test_packages[@]}")
elif gpu_visible; then
  packages+=(python3-venv)
fi

install_debian_packages() {
  local missing=() p sudo=""
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  [ ${#missing[@]} -gt 0 ] || return 0
  echo "launch/setup.sh: installing ${missing[*]}"
  if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null || { echo "launch/setup.sh: need root or sudo to install ${missing[*]}" >&2; exit 1; }
    sudo="sudo"
  fi
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -qq
  $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
}
install_debian_packages "${packages[@]}"

cd "$(dirname "$0")/.."

# A small venv over the system's NumPy, for what pip fetches: the safetensors package (not in
# Debian 12; the layer tests write their checkpoints and adapters with it) and downloads. Best
# effort: without network the tests that need it are not registered (CMake looks for
# build/pyenv/bin/python).
make_pyenv() {
  build/pyenv/bin/python -c "import safetensors.numpy" 2>/dev/null && return 0
  /usr/bin/python3 -m venv --system-site-packages build/pyenv &&
    build/pyenv/bin/pip install -q safetensors ||
    echo "launch/setup.sh: could not install safetensors into build/pyenv (its tests are skipped)" >&2
}

# cudnn-frontend, cuDNN's header-only C++ graph API (the CUDA backend's fused attention), from the
# include/ folder of its PyPI wheel into build/third_party/cudnn-frontend. Best effort: without
# it (no network) the cuDNN path is not compiled and --kernel cudnn is refused. Pinned: the
# version the planner's bounds and CI's validation were checked against.
fetch_cudnn_frontend() {
  local version=1.32.0 fe=build/third_party/cudnn-frontend wheel_dir
  [ "$(cat "$fe/VERSION" 2>/dev/null)" != "$version" ] || return 0
  wheel_dir=$(mktemp -d)
  if build/pyenv/bin/pip download -q --no-deps --dest "$wheel_dir" "nvidia-cudnn-frontend==$version" &&
     rm -rf "$fe" && mkdir -p "$fe" &&
     build/pyenv/bin/python - "$wheel_dir"/nvidia_cudnn_frontend-*.whl "$fe" <<'PY'
import sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z:
    z.extractall(sys.argv[2], [n for n in z.namelist() if n.startswith("include/")])
PY
  then
    echo "$version" > "$fe/VERSION"
  else
    echo "launch/setup.sh: could not fetch the cudnn-frontend headers into $fe (the cuDNN path is not built)" >&2
  fi
  rm -rf "$wheel_dir"
}

# What `pip install .` takes from PyPI (scikit-build-core and pybind11 to build the wheel, numpy and
# mpi4py beside it), as wheels in build/wheels: the test of the wheel (tests/python/pip_install.sh)
# installs from there alone, without the network.
fetch_wheels() {
  [ ! -f build/wheels/.complete ] || return 0
  rm -rf build/wheels && mkdir -p build/wheels
  build/pyenv/bin/pip download -q --dest build/wheels scikit-build-core pybind11 numpy mpi4py &&
    touch build/wheels/.complete ||
    echo "launch/setup.sh: could not download the wheels pip install needs into build/wheels (its test fails)" >&2
}

# PyTorch 2 and transformers for ringattn.hf and its tests (Debian's PyTorch 1.13 is too old for
# current transformers), in a venv of their own: build/hfenv, without the system's packages, so
# that Debian's torch cannot shadow PyTorch 2. PyPI's torch for Linux is the CUDA build: with its
# CUDA libraries the venv takes about 4.5 GB, so it is made once per machine under
# RINGATTN_HF_VENV (default ~/.cache/ringattn/, one folder per pinned version) and build/hfenv
# links to it; a fresh checkout, as CI's, finds it there. Triton (1 GB, for torch.compile) is left
# out. The versions are the ones tested (README, "With Hugging Face models"); the tests that need
# them fail, not skip, when the venv is missing.
hf_pins=(torch==2.15.0 transformers==5.24.0)
hf_check='import sys, torch, transformers, mpi4py, numpy
sys.exit(torch.__version__.split("+")[0] != sys.argv[1] or transformers.__version__ != sys.argv[2])'
hf_ok() { "$1/bin/python" -c "$hf_check" "${hf_pins[0]#torch==}" "${hf_pins[1]#transformers==}" 2>/dev/null; }
install_hf_venv() {
  local hf_venv pip
  hf_ok build/hfenv && return 0
  hf_venv=${RINGATTN_HF_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/ringattn/hfenv-${hf_pins[0]}-${hf_pins[1]}}
  mkdir -p "$(dirname "$hf_venv")" build
  (
    flock 9  # one install at a time for every checkout on this machine
    if ! hf_ok "$hf_venv"; then
      echo "launch/setup.sh: installing ${hf_pins[*]} into $hf_venv (a few minutes, about 4.5 GB)"
      rm -rf "$hf_venv"
      /usr/bin/python3 -m venv "$hf_venv"
      pip=("$hf_venv/bin/python" -m pip install -q --disable-pip-version-check)
      "${pip[@]}" --no-deps "${hf_pins[0]}"
      "$hf_venv/bin/python" -c 'import importlib.metadata as m
print("\n".join(r for r in m.requires("torch") if not r.startswith("triton") and "extra ==" not in r))' \
        > "$hf_venv/torch-requirements.txt"
      "${pip[@]}" -r "$hf_venv/torch-requirements.txt" "${hf_pins[1]}" mpi4py numpy
    fi
  ) 9> "$(dirname "$hf_venv")/.install.lock" && hf_ok "$hf_venv" && { rm -rf build/hfenv; ln -s "$hf_venv" build/hfenv; } ||
    echo "launch/setup.sh: could not install ${hf_pins[*]} into $hf_venv: the Hugging Face tests will fail" >&2
}

if [ "$set_name" = tests ]; then
  make_pyenv
  fetch_cudnn_frontend
  fetch_wheels
  install_hf_venv
elif gpu_visible; then
  make_pyenv
  fetch_cudnn_frontend
fi
