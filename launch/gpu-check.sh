#!/usr/bin/env bash
# The prepared GPU check: the whole GPU path in one run, on a fresh machine with one GPU, CUDA,
# CMake and Python (PyTorch likely; MPI, Boost, NCCL perhaps not), no internet:
#   1. finds nvcc even when it is not on PATH (the toolkit's standard folders), configures the
#      whole project, or, when MPI/Boost/OpenBLAS/NCCL are missing, only the CPU and CUDA kernels,
#      their tests and the GPU benchmark (-DRINGATTN_GPU_CHECK_ONLY=ON); builds for this GPU only;
#   2. the kernel tests (ctest label cuda, without the CPU emulation's copies);
#   3. the CUDA backend and the ring on this GPU: 1 and 2 ranks of `ringattn --backend cuda`
#      (host-staged transfers) with --check, one rank on --comm nccl, and one rank of the LoRA
#      layer on it (cuBLAS bf16
#      GEMMs, its RoPE and bias kernels, NCCL's reduce-scatter) checked against the CPU backend,
#      when MPI is there (otherwise skipped, said so); and the Python module on CUDA tensors
#      (forward and backward at P = 1 against fp64, on torch's current stream;
#      tests/python/cuda_check.py) when it was built and torch has CUDA;
#   3b. cuDNN's fused attention (--kernel cudnn, cuDNN found as printed at the start): cuDNN's own
#      checks of every planned graph, the ring through the cuDNN path against fp64 at 1 and 2 ranks
#      (ringattn_cuda_mpi_tests RingCudnn*), the job with --kernel cudnn --check at 1 and 2 ranks;
#   3c. inference: `ringattn decode --backend cuda --check` (prefill 16K tokens, decode on the
#      CUDA decode kernel) at one rank on NCCL and two sharing the GPU;
#   4. the benchmark table: our kernels (ringattn_gpu_bench, every row checked against fp64) and
#      torch SDPA's flash backend (and flash-attn when importable) on the same shapes, bf16,
#      D = 64 and 128, L = 4K to 32K, causal and not, forward and backward TFLOP/s and ratios;
#      then the cuDNN table (launch/bench/cudnn_table.py): the job at 1 rank on --kernel cudnn and
#      own beside torch's flash and cuDNN backends and flash-attn, full, causal and a 4K window;
#      and the decode kernel's read rate against the same run's device copy bandwidth
#      (ringattn_gpu_decode_bench, 1M cached keys, checked against fp64);
#   5. compute-sanitizer memcheck, racecheck and synccheck on small shapes of every kernel
#      (forward, dQ, dK/dV, delta; tensor-core at D = 64, 96, 128, 256 and the simple kernels),
#      after the tests and the table so that a slow sanitizer cannot spend their budget;
#   6. the SASS report of the build (launch/sass-report.sh) when a disassembler is there;
#   7. Nsight Compute's sections on one forward and one backward kernel (ncu.log), when ncu is
#      there. With OUT set, every log and JSON file is also packed into $OUT/gpu-check-logs.tgz.
#
#   launch/gpu-check.sh [RESULT.json]
# RESULT.json defaults to $OUT/gpu-check.json when OUT is set, else <build>/gpu-check.json; the
# step logs and the other JSON files go to $OUT (or the build folder). Exit status: 0 when the
# tests, the sanitizers and the checks pass, 1 otherwise. Every step has a timeout and the whole
# check a budget (RINGATTN_GPU_CHECK_BUDGET seconds, default 420: 7 minutes).
# Environment: RINGATTN_GPU_CHECK_BUILD (build folder, default build-gpu-check),
# RINGATTN_GPU_CHECK_QUICK=1 (lengths 4K and 16K only), CUDA_ARCH (default: this GPU's, e.g. 90),
# RINGATTN_GPU_CHECK_SKIP (steps to leave out, by the first word of their name: e.g. "sanitizer
# bench torch sass" for a second run that only needs the rest), RINGATTN_GPU_CHECK_DEPS (an archive
# of launch/gpu-deps.sh: Boost.Program_options and OpenBLAS for machines without them, so that the
# whole project builds and the ring, the layer and the Python module run on the GPU),
# RINGATTN_GPU_CHECK_PREBUILT (kernel binaries built elsewhere, run when the build here fails).
set -uo pipefail
# Paths the caller gave, made absolute before the cd below.
for v in RINGATTN_GPU_CHECK_DEPS RINGATTN_GPU_CHECK_PREBUILT RINGATTN_GPU_CHECK_BUILD; do
  if [ -n "${!v:-}" ] && [ "${!v#/}" = "${!v}" ]; then export "$v=$PWD/${!v}"; fi
done
cd "$(dirname "$0")/.."

budget=${RINGATTN_GPU_CHECK_BUDGET:-420}
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
rm -f "$logs/ours.json" "$logs/torch.json"  # no stale results from an earlier run
status=0
jobs=$(nproc 2>/dev/null || echo 4)
export PYTHONUNBUFFERED=1
[ -f launch/env.sh ] && . launch/env.sh

# The CUDA toolkit: nvcc and compute-sanitizer from PATH, else from the standard install folders.
if ! command -v nvcc >/dev/null 2>&1; then
  for d in /usr/local/cuda/bin /usr/local/cuda-*/bin /opt/cuda/bin; do
    if [ -x "$d/nvcc" ]; then export PATH="$d:$PATH"; break; fi
  done
fi
nvcc_path=$(command -v nvcc || true)
[ -n "$nvcc_path" ] && export CUDACXX="$nvcc_path"
# A toolkit program (compute-sanitizer, ncu): from PATH, else beside nvcc or in its own folder of
# the toolkit; prints nothing when there is none.
toolkit_tool() {
  command -v "$1" 2>/dev/null && return
  [ -n "$nvcc_path" ] || return 0
  local c
  for c in "$(dirname "$nvcc_path")/$1" "$(dirname "$nvcc_path")/../$1/$1"; do
    [ -x "$c" ] && { echo "$c"; return; }
  done
  return 0
}
sanitizer=$(toolkit_tool compute-sanitizer)
arch=${CUDA_ARCH:-$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -n 1 | tr -d ' .')}
arch=${arch:-90}
lengths=4096,8192,16384,32768
[ "${RINGATTN_GPU_CHECK_QUICK:-0}" = "1" ] && lengths=4096,16384

# step NAME LIMIT COMMAND...: runs COMMAND under a timeout (LIMIT, or what is left of the
# budget), logs to $logs/NAME.log, shows the log's end, records "NAME EXIT SECONDS".
step() {
  local name=$1 limit=$2
  shift 2
  if [ "$name" != configure ] && [ "$name" != build ]; then  # everything after them needs the build
    case " ${RINGATTN_GPU_CHECK_SKIP:-} " in
      *" ${name%%_*} "*) echo "== $name: skipped (RINGATTN_GPU_CHECK_SKIP)"; echo "$name 126 0" >> "$steps"; return 0 ;;
    esac
  fi
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
  tail -n 25 "$logs/$name.log"
  echo "== $name: exit $rc after ${secs}s"
  return $rc
}
skipped() {  # skipped NAME WHY: recorded with exit 126
  echo "== $1: skipped: $2"
  echo "$1 126 0" >> "$steps"
}

echo "# ringattn GPU check: build $build, architecture sm_$arch, budget ${budget}s, result $result"
echo "# nvcc: ${nvcc_path:-not found}; compute-sanitizer: ${sanitizer:-not found}"
nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv,noheader 2>/dev/null || true
[ -n "$nvcc_path" ] && echo "# CUDA: $("$nvcc_path" --version | tail -n 1)"

# cuDNN for --kernel cudnn (loaded at run time): RINGATTN_CUDNN_LIBRARY, else the loader's
# libcudnn.so.9, else PyTorch's wheel (nvidia/cudnn/lib); cudnn.h for the build: the toolkit's, else
# the wheel's include/. cudnn-frontend's headers travel with the tree (carry build/third_party).
cudnn_wheel=$(python3 -c 'import nvidia.cudnn as c; print(list(c.__path__)[0])' 2>/dev/null || true)
if [ -z "${RINGATTN_CUDNN_LIBRARY:-}" ]; then
  cudnn_lib=$(ldconfig -p 2>/dev/null | awk '/libcudnn\.so\.9 / {print $NF; exit}')
  [ -z "$cudnn_lib" ] && [ -e "$cudnn_wheel/lib/libcudnn.so.9" ] && cudnn_lib=$cudnn_wheel/lib/libcudnn.so.9
  [ -n "$cudnn_lib" ] && export RINGATTN_CUDNN_LIBRARY=$cudnn_lib
fi
cudnn_version=$(python3 -c 'import ctypes, sys; v = ctypes.CDLL(sys.argv[1]).cudnnGetVersion(); print(f"{v // 10000}.{v // 100 % 100}.{v % 100}")' \
  "${RINGATTN_CUDNN_LIBRARY:-libcudnn.so.9}" 2>/dev/null || echo "none loadable")
echo "# cuDNN: ${RINGATTN_CUDNN_LIBRARY:-libcudnn.so.9 (loader path)}, version $cudnn_version"
cudnn_args=()
if [ ! -e "$(dirname "${nvcc_path:-/none}")/../include/cudnn.h" ] && [ -e "$cudnn_wheel/include/cudnn.h" ]; then
  cudnn_args=(-DCUDNN_INCLUDE_DIR="$cudnn_wheel/include")
fi
fe_version=$(cat build/third_party/cudnn-frontend/VERSION 2>/dev/null || echo "missing: the cuDNN path is not built")
echo "# cudnn-frontend headers: $fe_version"
: > "$logs/configure.log"
[ -n "$nvcc_path" ] || { echo "# no nvcc on PATH or in /usr/local/cuda*/bin: cannot build"; exit 1; }

# NCCL from PyTorch's wheel when the system has none (headers and library in nvidia/nccl).
nccl_args=()
if [ ! -e /usr/include/nccl.h ] && [ ! -e /usr/local/include/nccl.h ]; then
  nccl_dir=$(python3 -c 'import nvidia.nccl, os; print(os.path.dirname(nvidia.nccl.__file__))' 2>/dev/null || true)
  nccl_lib=$(ls "$nccl_dir"/lib/libnccl.so* 2>/dev/null | head -n 1 || true)
  if [ -n "$nccl_dir" ] && [ -e "$nccl_dir/include/nccl.h" ] && [ -n "$nccl_lib" ]; then
    nccl_args=(-DNCCL_INCLUDE_DIR="$nccl_dir/include" -DNCCL_LIBRARY="$nccl_lib")
  fi
fi

# The Python module for the python3 on PATH (the one with torch), pybind11 from it when pip installed it.
python_args=()
if command -v python3 >/dev/null 2>&1; then
  python_args=(-DRINGATTN_PYTHON_EXE="$(command -v python3)")
  pybind11_dir=$(python3 -c 'import pybind11; print(pybind11.get_cmake_dir())' 2>/dev/null || true)
  [ -n "$pybind11_dir" ] && python_args+=(-Dpybind11_DIR="$pybind11_dir")
fi

# What the machine lacks for the whole project, packed elsewhere by launch/gpu-deps.sh: the
# archive is unpacked into the build folder and its Boost and OpenBLAS are named to CMake; the
# programs find their libraries through LD_LIBRARY_PATH (mpirun's local ranks inherit it).
deps_args=()
if [ -n "${RINGATTN_GPU_CHECK_DEPS:-}" ]; then
  deps=$(cd "$build" && pwd)/deps
  rm -rf "$deps" && mkdir -p "$deps"
  if tar xJf "$RINGATTN_GPU_CHECK_DEPS" -C "$deps"; then
    deps_lib=$deps/lib/x86_64-linux-gnu
    boost_dir=$(ls -d "$deps_lib"/cmake/Boost-* | head -n 1)
    deps_args=(-DBoost_DIR="$boost_dir" -DOPENBLAS_INCLUDE_DIR="$deps/include/openblas"
               -DOPENBLAS_LIBRARY="$deps_lib/libopenblas.so")
    export LD_LIBRARY_PATH="$deps_lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    echo "# dependencies from $RINGATTN_GPU_CHECK_DEPS: $(basename "$boost_dir"), OpenBLAS"
  else
    echo "# could not unpack $RINGATTN_GPU_CHECK_DEPS; configuring without it"
  fi
fi

# 1. Configure: the whole project if this machine allows it, else the GPU check build; build.
mode=full
if ! step configure 120 cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES="$arch" \
     -DCMAKE_CUDA_COMPILER="$nvcc_path" ${nccl_args[@]+"${nccl_args[@]}"} ${python_args[@]+"${python_args[@]}"} \
     ${deps_args[@]+"${deps_args[@]}"} ${cudnn_args[@]+"${cudnn_args[@]}"} ||
   [ ! -d "$build/tests/kernels/cuda/CMakeFiles/ringattn_cuda_tests.dir" ]; then
  mode=check-only
  rm -rf "$build/CMakeCache.txt" "$build/CMakeFiles"
  step configure 90 cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES="$arch" \
    -DCMAKE_CUDA_COMPILER="$nvcc_path" -DRINGATTN_GPU_CHECK_ONLY=ON ${cudnn_args[@]+"${cudnn_args[@]}"} ||
    { echo "# configure failed: see $logs/configure.log"; exit 1; }
fi
echo "# build mode: $mode"
if [ "$mode" = full ]; then
  targets=(ringattn ringattn_gpu_host_tests ringattn_cuda_tests ringattn_cuda_mpi_tests ringattn_gpu_bench
           ringattn_gpu_decode_bench ringattn_cudnn_graph_tests)
  # The Python module, when pybind11 and the Python headers were found.
  [ -d "$build/python/CMakeFiles/ringattn_python.dir" ] && targets+=(ringattn_python)
else
  targets=(all)
fi
bench=$build/ringattn_gpu_bench
cuda_tests=$build/ringattn_cuda_tests
if ! step build 240 cmake --build "$build" -j"$jobs" --target "${targets[@]}"; then
  echo "# build failed: see $logs/build.log"
  status=1
  # RINGATTN_GPU_CHECK_PREBUILT: a folder with ringattn_gpu_bench and ringattn_cuda_tests built
  # elsewhere for this architecture (and libcudart.so.13 when the toolkit here has another), so
  # that a failed build here still leaves the kernels checked.
  prebuilt=${RINGATTN_GPU_CHECK_PREBUILT:-}
  if [ -n "$prebuilt" ] && [ -x "$prebuilt/ringattn_gpu_bench" ]; then
    echo "# running the prebuilt binaries of $prebuilt"
    export LD_LIBRARY_PATH="$prebuilt${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    bench=$prebuilt/ringattn_gpu_bench
    cuda_tests=$prebuilt/ringattn_cuda_tests
    mode=prebuilt
  fi
fi

# 2. The kernel tests (the emulated copies are for machines without a GPU).
if [ "$mode" = prebuilt ]; then
  step tests 120 "$cuda_tests" || status=1
else
  step tests 120 ctest --test-dir "$build" -L cuda -E 'emulated|mpi' --output-on-failure --timeout 110 || status=1
fi

# 3. The CUDA backend and the ring on this GPU: one rank, and two ranks sharing it (host-staged).
if [ "$mode" = full ] && command -v mpirun >/dev/null 2>&1; then
  ring=(--backend cuda --comm mpi --dtype bf16 --seq-len 16384 --heads 8 --head-dim 128 --causal --backward --check)
  step ring_np1 40 mpirun -np 1 --oversubscribe --bind-to none "$build/ringattn" "${ring[@]}" \
    --json "$logs/ring_np1.json" || status=1
  step ring_np2 60 mpirun -np 2 --oversubscribe --bind-to none "$build/ringattn" "${ring[@]}" \
    --json "$logs/ring_np2.json" || status=1
  # The attention job on the NCCL communicator: one rank (NCCL allows one rank per GPU), so no
  # transfer, but its non-blocking init, stream ordering and teardown on a real device.
  step ring_nccl_np1 40 mpirun -np 1 --oversubscribe --bind-to none "$build/ringattn" "${ring[@]/mpi/nccl}" \
    --json "$logs/ring_nccl_np1.json" || status=1
  step ring_tests 90 ctest --test-dir "$build" -R '^cuda_mpi_np[12]$' --output-on-failure --timeout 85 || status=1
  # Inference on this GPU (the KV cache in device memory): a 16K-token prompt prefilled through the
  # ring's kernels, then decode steps on the CUDA decode kernel, --check'ed against fp64; one rank
  # on NCCL, and two sharing the GPU (host-staged MPI: the merge of their partial states).
  decode_args=(decode --backend cuda --dtype bf16 --seq-len 16384 --heads 32 --kv-heads 8 --head-dim 128
               --new-tokens 8 --check)
  step decode_np1 40 mpirun -np 1 --oversubscribe --bind-to none "$build/ringattn" "${decode_args[@]}" --comm nccl \
    --json "$logs/decode_np1.json" || status=1
  step decode_np2 60 mpirun -np 2 --oversubscribe --bind-to none "$build/ringattn" "${decode_args[@]}" --comm mpi \
    --json "$logs/decode_np2.json" || status=1
  # The LoRA layer (L 2048, d_model 512, 8 heads, 2 KV heads, r 16, biases, RoPE, bf16) forward and
  # backward on this GPU, --check'ed against the CPU backend in fp32; inputs written by the
  # emulated tests' own helper (plain Python).
  layer_dir=$build/layer-check
  rm -rf "$layer_dir"
  if layer_args=$(python3 -c 'import sys; sys.path[:0] = ["tests/comm"]; import nccl_emulated_cli as t
print(" ".join(t.layer_files(sys.argv[1], batch=1, seq_len=2048, d_model=512, heads=8, kv_heads=2, rank=16)))' \
       "$layer_dir" 2>> "$logs/layer_np1.log"); then
    # shellcheck disable=SC2086  # (the arguments are paths under $build and numbers)
    step layer_np1 60 mpirun -np 1 --oversubscribe --bind-to none "$build/ringattn" layer $layer_args \
      --backend cuda --comm nccl --dtype bf16 --causal --rope-theta 10000 --dy "$layer_dir/dy.npy" --check \
      --json "$logs/layer_np1.json" || status=1
  else
    skipped layer_np1 "python3 could not write the layer's inputs (see $logs/layer_np1.log)"
  fi
  # 3b. cuDNN's fused attention (--kernel cudnn): every graph the planner makes through cuDNN's own
  # checks; the ring through the cuDNN path against fp64 (every mask kind, both schedules, every
  # layout; the kernel choice's errors; the deterministic backward) at 1 and 2 ranks sharing the
  # GPU; the job with --check at 1 and 2 ranks.
  step cudnn_graphs 60 "$build/ringattn_cudnn_graph_tests" || status=1
  step cudnn_ring_np1 120 mpirun -np 1 --oversubscribe --bind-to none "$build/ringattn_cuda_mpi_tests" \
    --gtest_filter='RingCudnn*' || status=1
  step cudnn_ring_np2 120 mpirun -np 2 --oversubscribe --bind-to none "$build/ringattn_cuda_mpi_tests" \
    --gtest_filter='RingCudnn*' || status=1
  step cudnn_job_np1 40 mpirun -np 1 --oversubscribe --bind-to none "$build/ringattn" "${ring[@]}" --kernel cudnn \
    --json "$logs/cudnn_job_np1.json" || status=1
  step cudnn_job_np2 60 mpirun -np 2 --oversubscribe --bind-to none "$build/ringattn" "${ring[@]}" --kernel cudnn \
    --json "$logs/cudnn_job_np2.json" || status=1
else
  skipped ring "no MPI on this machine (check-only build): the ring's CUDA path is not run"
fi
if [ "$mode" = full ] && ls "$build"/python/ringattn/_ringattn*.so >/dev/null 2>&1; then
  # Prints "skipped" (exit 0) when torch has no CUDA.
  step python_cuda 60 env PYTHONPATH="$build/python" python3 tests/python/cuda_check.py || status=1
else
  skipped python_cuda "the Python module was not built (no MPI, pybind11 or Python headers)"
fi

# 4. Benchmarks: ours, then torch's on the same shapes, then one table.
bench_args=(--heads 16 --batch 1 --head-dims 64,128 --lengths "$lengths" --causal both --warmup 2 --iters 5)
step bench 120 "$bench" --json "$logs/ours.json" "${bench_args[@]}" || status=1
# 4a. The decode kernel's read rate against this device's copy bandwidth measured in the same run
# (1M cached keys, H 32, Hkv 8, D 128, bf16: 4 GiB read per call; two heads checked against fp64).
if [ -x "$build/ringattn_gpu_decode_bench" ]; then
  step decode_bench 60 "$build/ringattn_gpu_decode_bench" --keys 1048576 --heads 32 --kv-heads 8 --head-dim 128 \
    --dtype bf16 --iters 20 --json "$logs/decode_bench.json" || status=1
else
  skipped decode_bench "ringattn_gpu_decode_bench was not built"
fi
step torch 150 python3 launch/bench/bench_torch_sdpa.py --json "$logs/torch.json" "${bench_args[@]}" \
  --backends flash,cudnn || true
# 4b. The cuDNN table: the job at 1 rank on --kernel cudnn and on --kernel own, every row --check'ed
# (bf16, 16 heads, D = 64 and 128, the lengths above, full, causal and a causal 4K window), beside
# torch's flash and cuDNN backends and flash-attn from the step above.
if [ "$mode" = full ] && command -v mpirun >/dev/null 2>&1; then
  cudnn_runs=$build/cudnn-bench
  rm -rf "$cudnn_runs" && mkdir -p "$cudnn_runs"
  step bench_cudnn 240 bash -c '
    build=$1 runs=$2
    for d in 64 128; do for l in ${3//,/ }; do for mask in full causal window; do
      m=(); [ "$mask" = causal ] && m=(--causal); [ "$mask" = window ] && m=(--causal --window 4096,-1)
      for kernel in cudnn own; do
        mpirun -np 1 --oversubscribe --bind-to none "$build/ringattn" --backend cuda --comm mpi --dtype bf16 \
          --seq-len "$l" --heads 16 --head-dim "$d" "${m[@]}" --backward --kernel "$kernel" --warmup 2 --iters 5 \
          --check --json "$runs/${kernel}_D${d}_L${l}_${mask}.json" > /dev/null || echo "failed: $kernel D$d L$l $mask"
      done
    done; done; done' _ "$build" "$cudnn_runs" "$lengths" || status=1
  step cudnn_table 20 python3 launch/bench/cudnn_table.py --runs "$cudnn_runs" --torch "$logs/torch.json" \
    --out "$logs/cudnn_table.json" || true
fi

# 5. compute-sanitizer on small shapes of every kernel: the benchmark at L = 192 (three query tiles,
# causal and not, every tensor-core head dim, and the simple kernels), and, with GoogleTest, the
# tests that reach partial tiles under every mask kind, merging and GQA.
if [ -n "$sanitizer" ]; then
  small=(--heads 2 --lengths 192 --causal both --warmup 0 --iters 1)
  for tool in memcheck racecheck synccheck; do
    step "sanitizer_$tool" 60 "$sanitizer" --tool "$tool" --error-exitcode 9 \
      "$bench" "${small[@]}" --head-dims 64,96,128,256 --kernel tensor_core || status=1
    step "sanitizer_${tool}_simple" 40 "$sanitizer" --tool "$tool" --error-exitcode 9 \
      "$bench" "${small[@]}" --head-dims 64 --kernel simple || status=1
  done
  if grep -q 'GTest_FOUND:INTERNAL=1\|GTest_DIR:PATH=/' "$build/CMakeCache.txt" 2>/dev/null; then
    step sanitizer_memcheck_tests 60 "$sanitizer" --tool memcheck --error-exitcode 9 \
      "$cuda_tests" \
      --gtest_filter='AttentionCuda.EveryMaskAtOnce:AttentionCuda.GroupedQueryAttention:AttentionCuda.HeadDims96And256OnTensorCores:AttentionCuda.ChunkedForwardAndBackwardEqualOnePass' ||
      status=1
  fi
else
  skipped sanitizers "no compute-sanitizer next to nvcc or on PATH"
fi

# 6. What the compiler made of the kernels (needs cuobjdump; the CUDA images may lack it).
step sass 30 launch/sass-report.sh --arch "$arch" --json "$logs/sass.json" \
  "$build/kernels/cuda/libringattn_kernels_cuda.a" || true

# 7. Where the kernels' time goes: Nsight Compute on one forward and one backward tensor-core
# kernel (D = 128, L 16K, not causal), the sections that work without PC sampling; informative,
# never a failure. The clocks are left alone (--clock-control none), as for the timings above.
ncu_path=$(toolkit_tool ncu)
if [ -n "$ncu_path" ]; then
  step ncu 90 "$ncu_path" --clock-control none --section SpeedOfLight --section ComputeWorkloadAnalysis \
    --section MemoryWorkloadAnalysis --section SchedulerStats --section WarpStateStats --section Occupancy \
    --section InstructionStats -k 'regex:forward_kernel|backward_kernel' -c 2 \
    "$bench" --heads 16 --lengths 16384 --head-dims 128 --causal no --warmup 0 --iters 1 --kernel tensor_core || true
else
  skipped ncu "no Nsight Compute (ncu) next to nvcc or on PATH"
fi

step report 20 python3 launch/bench/bench_torch_sdpa.py --compare "$logs/ours.json" "$logs/torch.json" \
  --steps "$steps" --out "$result" || true
# The device tool brings back at most 8 files from $OUT: every log and JSON file in one archive too.
if [ -n "${OUT:-}" ] && [ "$logs" = "$OUT" ]; then
  (cd "$OUT" && tar czf gpu-check-logs.tgz --exclude gpu-check-logs.tgz ./*.log ./*.json 2>/dev/null) || true
fi
echo "# GPU check $([ "$status" = 0 ] && echo passed || echo FAILED): $result"
exit "$status"
