#include "tests/kernels/attention_cases.hpp"

#include <algorithm>
#include <limits>
#include <random>
#include <utility>

#include "tests/support/gtest_or_mini.hpp"

namespace ringattn::testing {

namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

Problem causal(Problem p) {
  p.mask.causal = true;
  return p;
}

Problem window(Problem p, int64_t left, int64_t right = kUnboundedWindow) {
  p.mask.window_left = left;
  p.mask.window_right = right;
  return p;
}

Problem documents(Problem p, std::vector<int64_t> lengths) {
  p.mask.set_documents(std::move(lengths));
  return p;
}

// A random block mask of blocks of `block` positions over the problem's rows.
Problem block_mask(Problem p, int64_t block, uint64_t seed, double density) {
  const int64_t n = (p.rows_q() + block - 1) / block;
  p.mask.set_block_mask(random_block_mask(n, seed, density), n, block);
  return p;
}

Problem bigbird(Problem p) {
  const int64_t n = (p.rows_q() + 31) / 32;
  p.mask.set_block_mask(bigbird_block_mask(n, 1, 1, 2, 42), n, 32);
  return p;
}

// Queries 0..49 and 150..199 (a zigzag shard) against keys 50..149, causal: the first 50 rows see no key.
Problem zigzag_shard() {
  std::vector<int64_t> qp = iota_positions(50);
  for (int64_t i = 150; i < 200; ++i) qp.push_back(i);
  return causal(Problem(1, 2, 2, 64, qp, iota_positions(100, 50)));
}

// Scores that climb steeply along the keys move a forward's running max (kept lazily on the CPU,
// see OnlineSoftmax in kernels/cpu/attention_tiles.inl) in almost every group of key rows, so the
// p rows a block already holds are rescaled; then they fall (no moves, p underflows to 0), then
// jump by ~700 in log2 units (a move that must come before any exponential, or p would overflow).
Problem climbing_scores(bool is_causal) {
  Problem p = basic(300, 64, 2, 1);
  p.mask.causal = is_causal;
  const int64_t D = p.dims.head_dim, H = p.dims.heads;
  auto key_height = [](int64_t j) -> float {
    if (j < 120) return 4.0f * float(j);
    if (j < 205) return 480.0f - 3.0f * float(j - 120);
    if (j < 230) return 2480.0f + float(j % 7);
    return 0.0f;
  };
  for (int64_t i = 0; i < p.rows_q(); ++i)
    for (int64_t h = 0; h < H; ++h) p.q[size_t((i * H + h) * D)] = 2.0f;
  for (int64_t j = 0; j < p.rows_k(); ++j) p.k[size_t(j * D)] += key_height(j);
  return p;
}

std::vector<AttentionCase> make_cases() {
  using Problems = std::vector<Problem>;
  std::vector<AttentionCase> c;
  auto add = [&](std::string name, std::function<Problems()> problems) {
    c.emplace_back();
    c.back().name = std::move(name), c.back().problems = std::move(problems);
    return &c.back();
  };
  add("NoMaskOddLength", [] { return Problems{basic()}; });
  add("Causal", [] { return Problems{causal(basic(200)), causal(basic(261))}; });
  add("SlidingWindowBothSides", [] { return Problems{window(basic(), 17, 5)}; });
  add("CausalSlidingWindow", [] { return Problems{causal(window(basic(260), 70)), causal(window(basic(300), 70))}; });
  add("Documents", [] { return Problems{documents(basic(), {50, 1, 80, 69})}; });
  add("DocumentsCausal", [] { return Problems{causal(documents(basic(), {64, 3, 0, 70, 63}))}; });
  add("SlidingWindowDocuments", [] { return Problems{documents(window(basic(200), 17, 5), {50, 1, 80, 69})}; });
  add("BlockMaskFinerThanTiles", [] { return Problems{block_mask(basic(), 16, 7, 0.4)}; });
  add("BlockMaskCoarserThanTiles", [] { return Problems{block_mask(basic(300), 128, 5, 0.5)}; });
  add("BigBird", [] { return Problems{bigbird(basic(300))}; });
  add("EveryMaskAtOnce", [] {
    return Problems{block_mask(documents(causal(window(basic(280), 90, 0)), {100, 130, 50}), 20, 3, 0.6)};
  });
  add("EmptyRowsFromBlockMask", [] {
    Problem p = basic(130);
    const int64_t n = (130 + 15) / 16;
    std::vector<uint8_t> m = random_block_mask(n, 11, 0.5);
    for (int64_t col = 0; col < n; ++col) m[size_t(2 * n + col)] = 0;  // block row 2 sees nothing
    p.mask.set_block_mask(m, n, 16);
    return Problems{p};
  })->empty = {32, 48};
  add("GroupedQueryAttention", [] { return Problems{causal(basic(150, 64, 4, 2))}; });
  add("MultiQueryAttention", [] {
    return Problems{window(basic(150, 32, 4, 1), 20, 20), window(basic(150, 64, 4, 1), 20, 20)};
  });
  add("Batch", [] { return Problems{causal(basic(99, 64, 2, 1, 3)), causal(basic(99, 64, 2, 1, 2))}; });
  add("OddLengths", [] {
    Problems ps{basic(1)};
    for (int64_t L : {1, 2, 63, 65, 129}) ps.push_back(causal(basic(L)));
    return ps;
  });
  add("HeadDims", [] {  // (a backend skips the head dims it lacks)
    Problems ps;
    for (int64_t D : {16, 32, 64, 80, 96, 128, 256, 512}) ps.push_back(causal(basic(131, D, 2, 1)));
    for (int64_t D : {16, 32, 80, 96, 128, 256}) ps.push_back(causal(basic(97, D, 2, 1)));
    return ps;
  });
  add("HeadDim128", [] { return Problems{causal(basic(190, 128, 4, 2, 2))}; });
  add("HeadDim128Documents", [] { return Problems{documents(basic(170, 128, 2, 2), {33, 100, 37})}; });
  add("HeadDims96And256OnTensorCores", [] { return head_dims_96_and_256(11); });
  add("StripedQueriesAgainstAllKeys", [] {
    return Problems{causal(Problem(1, 2, 2, 64, iota_positions(70, 2, 3), iota_positions(212))),
                    causal(Problem(2, 2, 2, 64, iota_positions(70, 2, 3), iota_positions(212)))};
  });
  add("ZigzagShardAgainstMiddleKeysHasEmptyRows", [] { return Problems{zigzag_shard()}; })->empty = {0, 50};
  add("GatheredKeyRows", [] {
    std::vector<int64_t> kp;
    for (int64_t j = 0; j < 400; j += (j % 7 == 0 ? 5 : 1)) kp.push_back(j);
    return Problems{causal(window(Problem(1, 2, 1, 64, iota_positions(120, 200), kp), 150))};
  });
  // |scores| ~ 1e4: a near-one-hot softmax; the rule's score rounding term allows for it.
  add("HugeScoresStayFinite", [] {
    return Problems{causal(Problem(1, 2, 2, 64, iota_positions(160), iota_positions(160), 5, 100.0f))};
  });
  add("RunningMaxMovesWithinAndAcrossBlocks", [] { return Problems{climbing_scores(false), climbing_scores(true)}; });
  add("Bf16StorageFp32Accumulation", [] { return Problems{causal(basic(170, 64, 4, 2))}; })->dtypes = {DType::bf16};
  return c;
}

// Attends to disjoint key chunks and merges, or accumulates chunk after chunk into one state (what
// the ring does): both equal one pass, in any order of merging; the backward over the chunks (dQ
// summed, dK and dV per chunk) equals one backward.
void check_chunked_passes(const KernelBackend& backend, const Problem& original,
                          const std::vector<std::pair<int64_t, int64_t>>& chunks) {
  const size_t n = chunks.size();
  for (DType t : all_dtypes())
    for (const KernelVariant& v : backend.variants(original.dims, t)) {
      const Problem p = rounded(original, t);
      const std::string tag = v.tag() + " ";
      const ChunkTolerance tol = backend.chunk_tolerance(v);
      const Outputs whole = run_kernels(backend, p, v);
      auto empty_state = [&] {
        return std::pair{std::vector<float>(p.q_elems(), 0.0f), std::vector<float>(p.lse_elems(), kNegInf)};
      };
      auto [acc_o, acc_lse] = empty_state();
      for (auto [s, e] : chunks) backend.forward(p, v, s, e, acc_o, acc_lse);
      EXPECT_LE(max_abs_diff(acc_o, whole.o), tol.forward) << tag << "accumulated O";
      EXPECT_LE(max_abs_diff(acc_lse, whole.lse), tol.forward) << tag << "accumulated LSE";

      std::vector<std::pair<std::vector<float>, std::vector<float>>> parts;
      for (auto [s, e] : chunks) {
        parts.push_back(empty_state());
        backend.forward(p, v, s, e, parts.back().first, parts.back().second);
      }
      auto merged = [&](size_t first) {  // parts first, first + 1, ... (cyclically)
        auto m = parts[first];
        for (size_t i = 1; i < n; ++i) {
          const auto& part = parts[(first + i) % n];
          backend.merge(p, m.first, m.second, part.first, part.second);
        }
        return m;
      };
      const auto in_order = merged(0), from_last = merged(n - 1);
      EXPECT_LE(max_abs_diff(in_order.first, whole.o), tol.forward) << tag << "merged O";
      EXPECT_LE(max_abs_diff(in_order.second, whole.lse), tol.forward) << tag << "merged LSE";
      EXPECT_LE(max_abs_diff(from_last.first, whole.o), tol.forward) << tag << "merged O, another order";
      EXPECT_LE(max_abs_diff(from_last.second, whole.lse), tol.forward) << tag << "merged LSE, another order";
      EXPECT_LE(max_abs_diff(in_order.first, from_last.first), tol.forward) << tag << "O of two merge orders";
      EXPECT_LE(max_abs_diff(in_order.second, from_last.second), tol.forward) << tag << "LSE of two merge orders";

      std::vector<float> dq(p.q_elems(), 0.0f), dk(p.k_elems(), 0.0f), dv(p.k_elems(), 0.0f);
      for (auto [s, e] : chunks) backend.backward(p, v, s, e, whole.o, whole.lse, dq, dk, dv);
      EXPECT_LE(max_abs_diff(dq, whole.dq), tol.dq) << tag << "dQ summed over chunks";
      EXPECT_LE(max_abs_diff(dk, whole.dk), tol.dkv) << tag << "dK per chunk";
      EXPECT_LE(max_abs_diff(dv, whole.dv), tol.dkv) << tag << "dV per chunk";
    }
}

}  // namespace

Problem basic(int64_t L, int64_t D, int64_t H, int64_t Hkv, int64_t B) {
  return Problem(B, H, Hkv, D, iota_positions(L), iota_positions(L));
}

std::vector<uint8_t> random_block_mask(int64_t n, uint64_t seed, double density) {
  std::mt19937_64 gen(seed);
  std::bernoulli_distribution bit(density);
  std::vector<uint8_t> m(size_t(n * n));
  for (auto& x : m) x = bit(gen);
  return m;
}

std::vector<Problem> head_dims_96_and_256(uint64_t mask_seed) {
  std::vector<Problem> ps;
  for (int64_t D : {96, 256}) ps.push_back(causal(block_mask(basic(150, D, 2, 1), 32, mask_seed, 0.7)));
  return ps;
}

const std::vector<AttentionCase>& attention_cases() {
  static const std::vector<AttentionCase> cases = make_cases();
  return cases;
}

void register_attention_tests(const std::string& suite, std::shared_ptr<const KernelBackend> backend) {
  for (const AttentionCase& c : attention_cases())
    register_test(suite, c.name, __FILE__, __LINE__, [backend, &c] {
      if (const std::string why = backend->unavailable(); !why.empty()) GTEST_SKIP() << why;
      int ran = 0;
      for (const Problem& p : c.problems()) ran += check_problem(*backend, p, c.dtypes, c.empty);
      if (ran == 0) GTEST_SKIP() << "no kernel of this backend runs these shapes and types";
    });
  register_test(suite, "ChunkedForwardAndBackwardEqualOnePass", __FILE__, __LINE__, [backend] {
    if (const std::string why = backend->unavailable(); !why.empty()) GTEST_SKIP() << why;
    check_chunked_passes(*backend, causal(window(basic(257, 64, 4, 2), 150)), {{0, 37}, {37, 160}, {160, 257}});
    check_chunked_passes(*backend, causal(basic(200, 64, 2, 1)), {{0, 90}, {90, 200}});
  });
}

}  // namespace ringattn::testing
