// The KV cache's placement without a communicator (every rank computes it alike): round-robin in
// units of `interleave` from equal shares, the smaller shares filled first after an uneven
// prefill, shares never more than a unit apart, and the capacity check.
#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "runtime/backend.hpp"
#include "runtime/inference/kv_cache.hpp"

namespace ringattn::inference {
namespace {

KVCache make_cache(AttentionBackend& backend, int rank, int ranks, int64_t interleave, int64_t capacity = 1000) {
  return KVCache(backend, rank, ranks, CacheShape{2, 2, 16, capacity, interleave, DType::f32});
}

// Appends `tokens` placed tokens to sequence 0 and returns their owners.
std::vector<int> append(KVCache& cache, int64_t tokens) {
  const std::vector<int> owners = cache.placement(0, tokens);
  std::vector<float> row(size_t(2 * 16), 1.0f);
  for (int64_t t = 0; t < tokens; ++t)
    cache.append_placed(0, owners[size_t(t)], cache.length(0) + t, row.data(), row.data());
  cache.set_length(0, cache.length(0) + tokens);
  return owners;
}

TEST(KVCachePlacement, RoundRobinInUnits) {
  auto backend = make_cpu_backend(1);
  KVCache cache = make_cache(*backend, 1, 3, 2);
  EXPECT_FALSE(cache.filled());
  const std::vector<int> owners = append(cache, 9);
  EXPECT_EQ(owners, (std::vector<int>{0, 0, 1, 1, 2, 2, 0, 0, 1}));
  EXPECT_TRUE(cache.filled());
  EXPECT_EQ(cache.rows(0, 0), 4);
  EXPECT_EQ(cache.rows(0, 1), 3);
  EXPECT_EQ(cache.rows(0), 3);  // this rank is rank 1
  EXPECT_EQ(cache.positions(0), (std::vector<int64_t>{2, 3, 8}));
  EXPECT_EQ(cache.rows(1, 0), 0);  // the other sequence is untouched
  // Decode continues the unit in progress: token 9 goes to rank 1 too.
  EXPECT_EQ(cache.placement(0, 3), (std::vector<int>{1, 2, 2}));
}

TEST(KVCachePlacement, UnevenSharesAreEvenedOutAndStayWithinAUnit) {
  auto backend = make_cpu_backend(1);
  for (int64_t interleave : {1, 3}) {
    KVCache cache = make_cache(*backend, 0, 4, interleave);
    // A prefill left 5, 2, 4, 2 rows.
    std::vector<float> rows(size_t(5 * 2 * 16), 1.0f);
    cache.store_rows(0, {0, 1, 2, 3, 4}, rows.data(), rows.data());
    cache.commit_rows(0, {5, 2, 4, 2}, 13);
    for (int step = 0; step < 40; ++step) {
      append(cache, 1);
      std::vector<int64_t> shares;
      for (int r = 0; r < 4; ++r) shares.push_back(cache.rows(0, r));
      const int64_t spread = *std::max_element(shares.begin(), shares.end()) -
                             *std::min_element(shares.begin(), shares.end());
      if (step >= 8) EXPECT_LE(spread, interleave) << "interleave " << interleave << " step " << step;
    }
    EXPECT_EQ(cache.length(0), 53);
  }
}

TEST(KVCachePlacement, CapacityIsChecked) {
  auto backend = make_cpu_backend(1);
  KVCache cache = make_cache(*backend, 0, 2, 1, 3);
  append(cache, 6);
  std::vector<int64_t> added(2, 0);
  for (int owner : cache.placement(0, 1)) ++added[size_t(owner)];
  const auto e = cache.capacity_problem(0, added, "capacity");
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->argument(), "capacity");
  EXPECT_NE(std::string(e->what()).find("past the cache's capacity 3"), std::string::npos) << e->what();
  EXPECT_EQ(check_cache_shape(CacheShape{1, 1, 24, 10, 1, DType::f32})->argument(), "head_dim");
  EXPECT_EQ(check_cache_shape(CacheShape{1, 1, 32, 0, 1, DType::f32})->argument(), "capacity");
  EXPECT_EQ(check_cache_shape(CacheShape{1, 1, 32, 10, 0, DType::f32})->argument(), "interleave");
}

}  // namespace
}  // namespace ringattn::inference
