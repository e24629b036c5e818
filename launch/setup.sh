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
  ccache                                  # the pip install test's wheel build, cached across checkouts
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

# cudnn-frontend, cuDNN's header-only C++ graph API (the CUDA backend's fused attention), from the
# include/ folder of its PyPI wheel into build/third_party/cudnn-frontend. Best effort: without
# it (no network) the cuDNN path is not compiled and --kernel cudnn is refused. Pinned: the
# version the planner's bounds and CI's validation were checked against.
cudnn_frontend_version=1.32.0
fe=build/third_party/cudnn-frontend
if [ "$(cat "$fe/VERSION" 2>/dev/null)" != "$cudnn_frontend_version" ]; then
  wheel_dir=$(mktemp -d)
  if build/pyenv/bin/pip download -q --no-deps --dest "$wheel_dir" "nvidia-cudnn-frontend==$cudnn_frontend_version" &&
     rm -rf "$fe" && mkdir -p "$fe" &&
     build/pyenv/bin/python - "$wheel_dir"/nvidia_cudnn_frontend-*.whl "$fe" <<'PY'
import sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z:
    z.extractall(sys.argv[2], [n for n in z.namelist() if n.startswith("include/")])
PY
  then
    echo "$cudnn_frontend_version" > "$fe/VERSION"
  else
    echo "launch/setup.sh: could not fetch the cudnn-frontend headers into $fe (the cuDNN path is not built)" >&2
  fi
  rm -rf "$wheel_dir"
fi

# What `pip install .` takes from PyPI (scikit-build-core and pybind11 to build the wheel, numpy and
# mpi4py beside it), as wheels in build/wheels: the test of the wheel (tests/python/pip_install.sh)
# installs from there alone, without the network.
if [ ! -f build/wheels/.complete ]; then
  rm -rf build/wheels && mkdir -p build/wheels
  build/pyenv/bin/pip download -q --dest build/wheels scikit-build-core pybind11 numpy mpi4py &&
    touch build/wheels/.complete ||
    echo "launch/setup.sh: could not download the wheels pip install needs into build/wheels (its test fails)" >&2
fi

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
if ! hf_ok build/hfenv; then
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
fi
