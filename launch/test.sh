#!/usr/bin/env bash
# Sets up, builds, and runs every test: the unit and MPI tests (ctest), the NCCL path on the
# emulated CUDA and NCCL, then the same tests under AddressSanitizer + UndefinedBehaviorSanitizer,
# then a bounded fuzzing run of the .npy and safetensors readers.
# RINGATTN_QUICK=1 skips the sanitizer build and the fuzzer.
set -euo pipefail
cd "$(dirname "$0")/.."

# Each phase's wall time, so that a CI log shows where its minutes go.
phase_start=$SECONDS
phase() {
  echo "[test.sh] ${1}: $(( SECONDS - phase_start )) s (total $SECONDS s)"
  phase_start=$SECONDS
}
trap 'phase "last phase (ended)"' EXIT

launch/setup.sh
phase setup
launch/build.sh
phase build
source launch/env.sh
# Tests run beside each other: none depends on the machine's speed (launch/stress-test.sh shows
# it), many mostly wait (mpirun's start, timeouts), and each says how many of the slots it takes
# (PROCESSORS: its ranks).
slots=$(( 2 * $(nproc) ))
ctest --test-dir build --output-on-failure --timeout 600 -j"$slots"
phase "ctest (build)"

# The NCCL path with no GPU: the whole program built on the CPU emulation of CUDA and NCCL
# (emulation/), and its tests (label nccl_emulation: the NCCL communicator, attention through
# --backend cuda --comm nccl at P = 1..4, the LoRA layer on cuBLAS and NCCL, a stopped rank).
cmake -S . -B build-emulated -DCMAKE_BUILD_TYPE=Release -DRINGATTN_CUDA_EMULATION=ON >/dev/null
cmake --build build-emulated -j"$(nproc)" --target ringattn ringattn_nccl_emulated_tests ringattn_lora_tests \
  ringattn_inference_tests
phase "build (emulated)"
ctest --test-dir build-emulated --output-on-failure --timeout 600 -j"$slots" -L nccl_emulation
phase "ctest (emulated)"

if [ "${RINGATTN_QUICK:-0}" = "1" ]; then
  exit 0
fi

# Sanitizers, on what they can find something in: the library (CPU backend; the CUDA backend on
# the emulation at one rank), the program, their tests, and the Python module's C++ half under
# Debian's PyTorch; built at -O1 (CMakeLists.txt), without the benchmarks. Not the labels slow
# and memory (sizes a sanitizer makes too slow, memory it measures wrong), netns (the network
# path, tested above) and no_sanitizer (the emulated CUDA ring past one rank, whose kernels one
# rank runs already; the hybrid model's script).
cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DRINGATTN_SANITIZE=ON -DRINGATTN_CUDA=OFF >/dev/null
cmake --build build-asan -j"$(nproc)"
phase "build (sanitizers)"
ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  ctest --test-dir build-asan --output-on-failure --timeout 900 -j"$slots" -LE "slow|memory|netns|no_sanitizer"
phase "ctest (sanitizers)"

# Fuzzing: libFuzzer with clang, bounded time shared by the .npy and safetensors readers, each
# seeded with its own corpus under tests/fuzz/corpus.
if [ -d tests/fuzz ]; then
  cmake -S . -B build-fuzz -DCMAKE_BUILD_TYPE=RelWithDebInfo -DRINGATTN_FUZZ=ON -DRINGATTN_CUDA=OFF \
    -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ >/dev/null
  cmake --build build-fuzz -j"$(nproc)" --target fuzz_npy fuzz_safetensors
  phase "build (fuzz)"
  seconds=$(( ${RINGATTN_FUZZ_SECONDS:-60} / 2 ))
  for target in npy safetensors; do
    corpus=$(mktemp -d)
    cp tests/fuzz/corpus/"$target"/* "$corpus"/
    build-fuzz/fuzz_"$target" "$corpus" -max_total_time="$seconds" -print_final_stats=1
    rm -rf "$corpus"
  done
fi
