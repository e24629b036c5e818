#!/usr/bin/env bash
# The prepared GPU check. On a machine with a GPU, CUDA, CMake, Python and PyTorch, but no
# internet and none of our Debian packages:
#   1. configures the whole project, or, when MPI/Boost/OpenBLAS/NCCL are missing, only the CPU
#      and CUDA kernels, their tests and the GPU benchmark (-DRINGATTN_GPU_CHECK_ONLY=ON);
#   2. builds for this GPU's architecture only;
#   3. runs the GPU tests (ctest label cuda, without the CPU emulation of the kernels);
#   4. benchmarks our forward and backward kernels (build/ringattn_gpu_bench, which also checks
#      sampled rows against fp64) and torch's scaled_dot_product_attention with the flash
#      backend on the same shapes (launch/bench/bench_torch_sdpa.py);
#   5. prints one table (our TFLOP/s, torch's, the ratio) and writes it as JSON.
#
#   launch/gpu-check.sh [RESULT.json]
# RESULT.json defaults to $OUT/gpu-check.json when OUT is set, else <build>/gpu-check.json; the
# step logs go to $OUT (or the build folder). Exit status: 0 when the tests pass and every
# sampled row is right, 1 otherwise. Every step has a timeout and the whole check a budget
# (RINGATTN_GPU_CHECK_BUDGET seconds, default 540), so it ends well inside 10 minutes.
# Environment: RINGATTN_GPU_CHECK_BUILD (build folder, default build-gpu-check),
# RINGATTN_GPU_CHECK_QUICK=1 (lengths 4K and 16K only), CUDA_ARCH (default: this GPU's, e.g. 90).
set -uo pipefail
cd "$(dirname "$0")/.."

budget=${RINGATTN_GPU_CHECK_BUDGET:-540}
deadline=$(( $(date +%s) + budget ))
build=${RINGATTN_GPU_CHECK_BUILD:-build-gpu-check}
mkdir -p "$build"
result=${1:-}
if [ -z "$result" ]; then
  if [ -n "${OUT:-}" ]; then result=$OUT/gpu-check.json; else result=$build/gpu-check.json; fi
fi
logs=${OUT:-$build}
mkdir -p "$logs" "$(dirname "$result")"
steps=$build/steps.txt
: > "$steps"
rm -f "$build/ours.json" "$build/torch.json"  # no stale results from an earlier run
status=0
jobs=$(nproc 2>/dev/null || echo 4)
arch=${CUDA_ARCH:-$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -n 1 | tr -d ' .')}
arch=${arch:-90}
lengths=4096,8192,16384,32768
[ "${RINGATTN_GPU_CHECK_QUICK:-0}" = "1" ] && lengths=4096,16384
export PYTHONUNBUFFERED=1

# step NAME LIMIT COMMAND...: runs COMMAND under a timeout (LIMIT, or what is left of the
# budget), logs to $logs/NAME.log, shows the log's end, records "NAME EXIT SECONDS".
step() {
  local name=$1 limit=$2
  shift 2
  local left=$(( deadline - $(date +%s) - 15 ))
  if [ "$left" -lt 20 ]; then
    echo "== $name: skipped, the check's budget is spent"
    echo "$name 125 0" >> "$steps"
    return 125
  fi
  [ "$left" -lt "$limit" ] && limit=$left
  echo "== $name (at most ${limit}s): $*"
  local start
  start=$(date +%s)
  timeout --kill-after=10 "$limit" "$@" >> "$logs/$name.log" 2>&1
  local rc=$?
  local secs=$(( $(date +%s) - start ))
  echo "$name $rc $secs" >> "$steps"
  tail -n 40 "$logs/$name.log"
  echo "== $name: exit $rc after ${secs}s"
  return $rc
}

echo "# ringattn GPU check: build $build, architecture sm_$arch, budget ${budget}s, result $result"
nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv,noheader 2>/dev/null || true
: > "$logs/configure.log"

# NCCL from PyTorch's wheel when the system has none (headers and library in nvidia/nccl).
nccl_args=()
if [ ! -e /usr/include/nccl.h ] && [ ! -e /usr/local/include/nccl.h ]; then
  nccl_dir=$(python3 -c 'import nvidia.nccl, os; print(os.path.dirname(nvidia.nccl.__file__))' 2>/dev/null || true)
  nccl_lib=$(ls "$nccl_dir"/lib/libnccl.so* 2>/dev/null | head -n 1 || true)
  if [ -n "$nccl_dir" ] && [ -e "$nccl_dir/include/nccl.h" ] && [ -n "$nccl_lib" ]; then
    nccl_args=(-DNCCL_INCLUDE_DIR="$nccl_dir/include" -DNCCL_LIBRARY="$nccl_lib")
  fi
fi

# 1. Configure: the whole project if this machine allows it, else the GPU check build.
mode=full
if ! step configure 150 cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES="$arch" \
     ${nccl_args[@]+"${nccl_args[@]}"} || [ ! -d "$build/tests/kernels/cuda/CMakeFiles/ringattn_cuda_tests.dir" ]; then
  mode=check-only
  rm -rf "$build/CMakeCache.txt" "$build/CMakeFiles"
  step configure 120 cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES="$arch" \
    -DRINGATTN_GPU_CHECK_ONLY=ON || { echo "# configure failed: see $logs/configure.log"; exit 1; }
fi
echo "# build mode: $mode"

# 2. Build what the check runs.
if [ "$mode" = full ]; then
  targets=(ringattn_gpu_host_tests ringattn_cuda_tests ringattn_cuda_mpi_tests ringattn_gpu_bench)
else
  targets=(all)
fi
if ! step build 300 cmake --build "$build" -j"$jobs" --target "${targets[@]}"; then
  echo "# build failed: see $logs/build.log"
  status=1
fi

# 3. GPU tests (the emulated copies of the same tests are for machines without a GPU).
step tests 200 ctest --test-dir "$build" -L cuda -E emulated --output-on-failure --timeout 180 || status=1

# 4. Benchmarks: ours, then torch's on the same shapes.
bench_args=(--heads 16 --batch 1 --head-dims 64,128 --lengths "$lengths" --causal both --warmup 2 --iters 5)
step bench 150 "$build/ringattn_gpu_bench" --json "$build/ours.json" "${bench_args[@]}" || status=1
step torch 150 python3 launch/bench/bench_torch_sdpa.py --json "$build/torch.json" "${bench_args[@]}" || true

# 5. One table, as JSON too.
step report 30 python3 launch/bench/bench_torch_sdpa.py --compare "$build/ours.json" "$build/torch.json" \
  --steps "$steps" --out "$result" || true
echo "# GPU check $([ "$status" = 0 ] && echo passed || echo FAILED): $result"
exit "$status"
