// The block-skipping plan of the CUDA kernels (kernels/mask/tile_plan.hpp), on the CPU, against
// brute force over every (query, key) pair: the candidate ranges must contain every block with a
// visible pair, 'empty' must mean no visible pair, 'full' must mean every pair visible, and the
// per-row element mask must equal visible(). Positions cover contiguous, strided, zigzag-like
// and gathered (gapped) row sets; masks every kind and combination of docs/reference.md.
#include <algorithm>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "kernels/mask/tile_plan.hpp"
#include "kernels/mask/mask_view.hpp"
#include "tests/support/gtest_or_mini.hpp"

namespace ringattn::kernels {
namespace {

// A MaskView with its arrays.
struct OwnedMask {
  std::vector<int64_t> doc_offsets;
  std::vector<uint8_t> blocks;
  MaskView view;

  void set_documents(const std::vector<int64_t>& lengths) {
    doc_offsets.assign(1, 0);
    for (int64_t n : lengths) doc_offsets.push_back(doc_offsets.back() + n);
    view.doc_offsets = doc_offsets.data();
    view.num_docs = int64_t(doc_offsets.size()) - 1;
  }
  void set_random_blocks(int64_t seq_len, int64_t block, double density, uint64_t seed) {
    const int64_t n = (seq_len + block - 1) / block;
    std::mt19937_64 gen(seed);
    std::bernoulli_distribution bit(density);
    blocks.resize(size_t(n * n));
    for (auto& b : blocks) b = bit(gen);
    view.block_mask = blocks.data();
    view.block_count = n;
    view.mask_block = block;
  }
};

std::vector<int64_t> contiguous(int64_t first, int64_t n) {
  std::vector<int64_t> p(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) p[size_t(i)] = first + i;
  return p;
}

std::vector<int64_t> strided(int64_t first, int64_t n, int64_t stride) {
  std::vector<int64_t> p(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) p[size_t(i)] = first + i * stride;
  return p;
}

// Two chunks, as a zigzag shard holds: [a, a + n) and [b, b + n).
std::vector<int64_t> two_chunks(int64_t a, int64_t b, int64_t n) {
  std::vector<int64_t> p = contiguous(a, n), q = contiguous(b, n);
  p.insert(p.end(), q.begin(), q.end());
  return p;
}

// A random strictly increasing subset of [0, seq_len) (gathered K/V rows).
std::vector<int64_t> gathered(int64_t seq_len, double keep, uint64_t seed) {
  std::mt19937_64 gen(seed);
  std::bernoulli_distribution bit(keep);
  std::vector<int64_t> p;
  for (int64_t i = 0; i < seq_len; ++i)
    if (bit(gen)) p.push_back(i);
  if (p.empty()) p.push_back(seq_len / 2);
  return p;
}

// Checks the plan of one (queries, keys, mask) combination with tiles of `tq` queries and blocks of `tk` keys.
void check_plan(const MaskView& m, const std::vector<int64_t>& qp, const std::vector<int64_t>& kp, int64_t tq,
                int64_t tk, const std::string& what) {
  const int64_t nq = int64_t(qp.size()), nk = int64_t(kp.size());
  for (int64_t i = 0; i < nq; ++i) {
    const RowMask rm = row_mask(m, qp[size_t(i)]);
    for (int64_t j = 0; j < nk; ++j) {
      ASSERT_EQ(row_sees(m, rm, kp[size_t(j)]), visible(m, qp[size_t(i)], kp[size_t(j)]))
          << what << ": row mask, query " << qp[size_t(i)] << " key " << kp[size_t(j)];
    }
  }
  for (int64_t qt = 0; qt < tile_count(nq, tq); ++qt) {
    const RowSpan q = row_span(qp.data(), nq, tq, qt);
    const TileRange cand = key_blocks_for_queries(m, q, kp.data(), nk, tk);
    for (int64_t kb = 0; kb < tile_count(nk, tk); ++kb) {
      const RowSpan k = row_span(kp.data(), nk, tk, kb);
      int64_t seen = 0, pairs = 0;
      for (int64_t i = q.row0; i < q.row0 + q.count; ++i)
        for (int64_t j = k.row0; j < k.row0 + k.count; ++j, ++pairs) seen += visible(m, qp[size_t(i)], kp[size_t(j)]);
      const TileKind kind = classify_tile(m, q, k);
      const bool in_candidates = kb >= cand.first && kb < cand.last;
      const TileRange back = query_tiles_for_keys(m, k, qp.data(), nq, tq);
      const bool in_back = qt >= back.first && qt < back.last;
      if (seen > 0) {
        ASSERT_TRUE(in_candidates) << what << ": key block " << kb << " missing for query tile " << qt;
        ASSERT_TRUE(in_back) << what << ": query tile " << qt << " missing for key block " << kb;
        ASSERT_NE(int(kind), int(TileKind::empty))
            << what << ": tile " << qt << " x block " << kb << " sees " << seen << " pairs but is classified empty";
      }
      if (kind == TileKind::full) {
        ASSERT_EQ(seen, pairs) << what << ": tile " << qt << " x block " << kb << " classified full";
      }
    }
  }
}

struct PositionSet {
  const char* name;
  std::vector<int64_t> q, k;
};

std::vector<PositionSet> position_sets() {
  return {
      {"contiguous", contiguous(0, 300), contiguous(0, 300)},
      {"shard vs later keys", contiguous(0, 150), contiguous(150, 150)},
      {"shard vs earlier keys", contiguous(200, 100), contiguous(0, 200)},
      {"zigzag shard", two_chunks(40, 260, 40), contiguous(0, 300)},
      {"striped", strided(3, 70, 4), strided(1, 75, 4)},
      {"gathered keys", contiguous(100, 130), gathered(300, 0.4, 5)},
      {"gathered both", gathered(300, 0.5, 6), gathered(300, 0.3, 7)},
      {"one row", contiguous(77, 1), contiguous(0, 300)},
  };
}

std::vector<std::pair<std::string, OwnedMask>> masks() {
  std::vector<std::pair<std::string, OwnedMask>> out;
  auto add = [&](const std::string& name, auto&& setup) {
    OwnedMask m;
    setup(m);
    out.emplace_back(name, std::move(m));
  };
  add("none", [](OwnedMask&) {});
  add("causal", [](OwnedMask& m) { m.view.causal = true; });
  add("window(17,5)", [](OwnedMask& m) { m.view.window_left = 17, m.view.window_right = 5; });
  add("causal+window(70,-1)", [](OwnedMask& m) { m.view.causal = true, m.view.window_left = 70; });
  add("docs", [](OwnedMask& m) { m.set_documents({50, 1, 80, 69, 100}); });
  add("causal+docs", [](OwnedMask& m) { m.view.causal = true, m.set_documents({64, 3, 0, 70, 63, 100}); });
  add("block(16)", [](OwnedMask& m) { m.set_random_blocks(300, 16, 0.4, 3); });
  add("block(64)", [](OwnedMask& m) { m.set_random_blocks(300, 64, 0.5, 4); });
  add("block(5)", [](OwnedMask& m) { m.set_random_blocks(300, 5, 0.3, 8); });  // wide rectangles: not scanned
  add("all", [](OwnedMask& m) {
    m.view.causal = true, m.view.window_left = 90, m.view.window_right = 0;
    m.set_documents({100, 130, 70});
    m.set_random_blocks(300, 20, 0.6, 9);
  });
  return out;
}

TEST(TilePlan, EveryMaskEveryPositionSet) {
  const std::vector<std::pair<std::string, OwnedMask>> all = masks();
  for (const auto& [mask_name, mask] : all)
    for (const PositionSet& ps : position_sets())
      for (int64_t tq : {32, 64})
        for (int64_t tk : {32, 64}) {
          const std::string what = mask_name + " / " + ps.name + " / " + std::to_string(tq) + "x" + std::to_string(tk);
          check_plan(mask.view, ps.q, ps.k, tq, tk, what);
        }
}

// Skipping is not only sound but effective: a causal plan over contiguous rows visits no block
// above the diagonal and classifies blocks strictly below it full.
TEST(TilePlan, CausalSkipsAndFullBlocks) {
  MaskView m;
  m.causal = true;
  const std::vector<int64_t> p = contiguous(0, 256);
  for (int64_t qt = 0; qt < 4; ++qt) {
    const RowSpan q = row_span(p.data(), 256, 64, qt);
    const TileRange r = key_blocks_for_queries(m, q, p.data(), 256, 64);
    EXPECT_EQ(r.first, 0);
    EXPECT_EQ(r.last, qt + 1);
    for (int64_t kb = r.first; kb < r.last; ++kb) {
      const TileKind kind = classify_tile(m, q, row_span(p.data(), 256, 64, kb));
      EXPECT_EQ(int(kind), int(kb < qt ? TileKind::full : TileKind::partial));
    }
  }
}

TEST(TilePlan, SlidingWindowVisitsOnlyTheBand) {
  MaskView m;
  m.causal = true;
  m.window_left = 100;
  const std::vector<int64_t> p = contiguous(0, 1024);
  const RowSpan q = row_span(p.data(), 1024, 64, 10);  // queries 640..703 see keys 540..703
  const TileRange r = key_blocks_for_queries(m, q, p.data(), 1024, 64);
  EXPECT_EQ(r.first, 540 / 64);
  EXPECT_EQ(r.last, 703 / 64 + 1);
  const RowSpan k = row_span(p.data(), 1024, 64, 9);  // keys 576..639 are seen by queries 576..739
  const TileRange back = query_tiles_for_keys(m, k, p.data(), 1024, 32);
  EXPECT_EQ(back.first, 576 / 32);
  EXPECT_EQ(back.last, 739 / 32 + 1);
}

TEST(TilePlan, QueriesBeforeEveryKeySeeNothing) {
  MaskView m;
  m.causal = true;
  const std::vector<int64_t> q = contiguous(0, 50), k = contiguous(100, 50);
  EXPECT_TRUE(key_blocks_for_queries(m, row_span(q.data(), 50, 64, 0), k.data(), 50, 64).empty());
  EXPECT_TRUE(query_tiles_for_keys(m, row_span(k.data(), 50, 64, 0), q.data(), 50, 32).empty());
}

}  // namespace
}  // namespace ringattn::kernels
