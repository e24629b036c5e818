// Mask arithmetic: key/query ranges, tile classification and the BigBird generator, checked
// against brute force over every (i, j) pair.
#include <gtest/gtest.h>

#include <random>

#include "kernels/mask/mask_view.hpp"
#include "kernels/mask/mask.hpp"

namespace ringattn {
namespace {

Mask sample_mask(int variant) {
  Mask m;
  switch (variant % 6) {
    case 0: m.causal = true; break;
    case 1: m.window_left = 7; m.window_right = 3; break;
    case 2: m.causal = true; m.window_left = 11; break;
    case 3: m.set_documents({9, 0, 20, 1, 30}); break;
    case 4: m.causal = true; m.set_documents({25, 35}); m.window_left = 12; break;
    case 5: m.window_right = 0; m.set_documents({60}); break;
  }
  return m;
}

TEST(Mask, KeyAndQueryRangesMatchBruteForce) {
  const int64_t L = 60;
  for (int variant = 0; variant < 6; ++variant) {
    Mask mask = sample_mask(variant);
    if (!mask.has_documents()) mask.set_documents({L});
    const MaskView m = mask.view();
    for (int64_t i = 0; i < L; ++i)
      for (int64_t j = 0; j < L; ++j) {
        bool expect = true;
        if (mask.causal && j > i) expect = false;
        if (mask.window_left >= 0 && j < i - mask.window_left) expect = false;
        if (mask.window_right >= 0 && j > i + mask.window_right) expect = false;
        if (document_of(m, i) != document_of(m, j)) expect = false;
        EXPECT_EQ(key_range(m, i).contains(j), expect) << "variant " << variant << " i " << i << " j " << j;
        EXPECT_EQ(query_range(m, j).contains(i), expect) << "variant " << variant << " i " << i << " j " << j;
      }
  }
}

TEST(Mask, DocumentOfHandlesEmptyDocuments) {
  Mask mask;
  mask.set_documents({3, 0, 0, 2});
  const MaskView m = mask.view();
  EXPECT_EQ(document_of(m, 0), 0);
  EXPECT_EQ(document_of(m, 2), 0);
  EXPECT_EQ(document_of(m, 3), 3);
  EXPECT_EQ(document_of(m, 4), 3);
}

// 'full' and 'empty' must be exact claims for every pair in the tile; 'partial' is always safe.
TEST(Mask, TileClassificationIsSound) {
  std::mt19937 gen(5);
  for (int variant = 0; variant < 6; ++variant) {
    const Mask mask = sample_mask(variant);
    const MaskView m = mask.view();
    for (int trial = 0; trial < 400; ++trial) {
      const int64_t q0 = gen() % 60, q1 = q0 + gen() % 8, k0 = gen() % 60, k1 = k0 + gen() % 8;
      const TileKind kind = classify_intervals(key_range(m, q0), key_range(m, q1), k0, k1);
      bool any = false, all = true;
      for (int64_t i = q0; i <= q1; ++i)
        for (int64_t j = k0; j <= k1; ++j) (visible(m, i, j) ? any : all) = visible(m, i, j) ? true : false;
      if (kind == TileKind::full) EXPECT_TRUE(all);
      if (kind == TileKind::empty) EXPECT_FALSE(any);
    }
  }
}

TEST(Mask, BlockMaskClassification) {
  Mask mask;
  mask.set_block_mask({1, 0, 1, 1}, 2, 4);
  const MaskView m = mask.view();
  EXPECT_EQ(classify_block_mask(m, 0, 3, 0, 3), TileKind::full);
  EXPECT_EQ(classify_block_mask(m, 0, 3, 4, 7), TileKind::empty);
  EXPECT_EQ(classify_block_mask(m, 0, 7, 0, 7), TileKind::partial);
  EXPECT_TRUE(visible(m, 5, 1));
  EXPECT_FALSE(visible(m, 1, 5));
}

TEST(Mask, BigBirdStructure) {
  const int64_t n = 20, g = 2, w = 1, r = 3;
  const auto m = bigbird_block_mask(n, g, w, r, 99);
  EXPECT_EQ(m, bigbird_block_mask(n, g, w, r, 99));  // reproducible from the seed
  EXPECT_NE(m, bigbird_block_mask(n, g, w, r, 100));
  for (int64_t i = 0; i < n; ++i) {
    int64_t extra = 0;
    for (int64_t j = 0; j < n; ++j) {
      const bool base = i < g || j < g || (j >= i - w && j <= i + w);
      if (base) EXPECT_EQ(m[size_t(i * n + j)], 1);
      else extra += m[size_t(i * n + j)];
    }
    if (i >= g) EXPECT_EQ(extra, r) << "row " << i;  // global rows already see everything
  }
}

TEST(Mask, Describe) {
  Mask m;
  EXPECT_EQ(m.describe(), "none");
  m.causal = true;
  m.window_left = 4096;
  EXPECT_EQ(m.describe(), "causal+window(4096,-1)");
}

}  // namespace
}  // namespace ringattn
