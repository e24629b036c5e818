// The attention kernel tests every backend runs, declared once (after ggml's test-backend-ops):
// a table of cases (shapes, masks, GQA/MQA, batch, partial tiles, rows that see no key, huge
// scores...), each run on every variant of every element type a backend has and judged against
// fp64 (check_problem, kernel_backend.hpp); and the contract of kernels/attention.hpp's partial
// states (passes over key chunks, accumulated or merged, equal one pass, forward and backward).
// register_attention_tests registers them all as SUITE.<case> for one backend:
// tests/kernels/cpu/test_attention_cpu.cpp as AttentionCpu, tests/kernels/cuda/test_attention_cuda.cpp
// as AttentionCuda. What concerns one backend only stays in that backend's file.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "tests/kernels/kernel_backend.hpp"

namespace ringattn::testing {

struct AttentionCase {
  std::string name;
  std::function<std::vector<Problem>()> problems;  // built when the case runs
  std::vector<DType> dtypes = all_dtypes();
  RowRange empty;  // query rows that must see no key
};

const std::vector<AttentionCase>& attention_cases();

// Registers every case and contract as SUITE.NAME for the backend (from a static initializer).
void register_attention_tests(const std::string& suite, std::shared_ptr<const KernelBackend> backend);

// What the cases are built from, for the backends' own tests too.
Problem basic(int64_t L = 200, int64_t D = 64, int64_t H = 2, int64_t Hkv = 2, int64_t B = 1);
std::vector<uint8_t> random_block_mask(int64_t n, uint64_t seed, double density);
// D = 96 and 256 (the tensor-core head dims whose tile shapes differ between GPU architectures)
// under a causal block mask (seeded by `mask_seed`) with GQA: full, partial and empty tiles.
std::vector<Problem> head_dims_96_and_256(uint64_t mask_seed);

}  // namespace ringattn::testing
