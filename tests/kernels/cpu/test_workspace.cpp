// The CPU kernels' per-call workspace: aligned, writable arrays of every size, including the
// huge-page-advised mappings of 2 MiB and more, and the cache that hands those to the next call
// without ever holding more than the largest call used.
#include "kernels/cpu/workspace.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <numeric>
#include <thread>
#include <vector>

namespace ringattn::kernels::cpu {
namespace {

TEST(Workspace, ArraysAreAlignedDisjointAndWritable) {
  Workspace ws;
  // Small arrays come from the heap, those of 2 MiB and more from huge-page-aligned mappings
  // (an odd size, so the mapping's tail is not a whole huge page).
  const std::vector<size_t> sizes = {0, 1, 17, 4096, (size_t{2} << 20) / 4, (size_t{5} << 20) / 4 + 3, 1000};
  std::vector<float*> arrays;
  for (size_t n : sizes) {
    float* p = ws.take<float>(n);
    ASSERT_NE(p, nullptr);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 64, 0u) << n;
    if (n * sizeof(float) >= (size_t{2} << 20)) EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % (size_t{2} << 20), 0u) << n;
    std::iota(p, p + n, float(arrays.size()));  // every element writable
    arrays.push_back(p);
  }
  for (size_t a = 0; a < sizes.size(); ++a)  // no array overwrote another
    for (size_t i = 0; i < sizes[a]; i += 997) ASSERT_EQ(arrays[a][i], float(a) + float(i)) << a << " " << i;
}

TEST(Workspace, TypesKeepTheirAlignment) {
  Workspace ws;
  auto* bytes = ws.take<uint8_t>(3);
  auto* words = ws.take<uint32_t>(5);
  auto* longs = ws.take<int64_t>(7);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(bytes) % 64, 0u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(words) % 64, 0u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(longs) % 64, 0u);
}

constexpr size_t kMiB = size_t{1} << 20;

TEST(Workspace, NextCallReusesTheMappingsOfTheLast) {
  release_cached_workspace();
  void* first = nullptr;
  {
    Workspace ws;
    first = ws.take<char>(6 * kMiB);
    EXPECT_EQ(cached_workspace_bytes(), 0u);
  }
  EXPECT_EQ(cached_workspace_bytes(), 6 * kMiB);
  {
    Workspace ws;
    EXPECT_EQ(ws.take<char>(6 * kMiB - 100), first);  // same size up to the page: the same mapping
    EXPECT_EQ(cached_workspace_bytes(), 0u);
  }
  release_cached_workspace();
  EXPECT_EQ(cached_workspace_bytes(), 0u);
}

TEST(Workspace, AMissUnmapsTheCacheBeforeMapping) {
  release_cached_workspace();
  { Workspace ws; ws.take<char>(4 * kMiB); ws.take<char>(8 * kMiB); }
  EXPECT_EQ(cached_workspace_bytes(), 12 * kMiB);
  {
    Workspace ws;
    ws.take<char>(8 * kMiB);  // a hit leaves the other cached
    EXPECT_EQ(cached_workspace_bytes(), 4 * kMiB);
    ws.take<char>(16 * kMiB);  // nothing fits: the 4 MiB go back before 16 are mapped
    EXPECT_EQ(cached_workspace_bytes(), 0u);
  }
  EXPECT_EQ(cached_workspace_bytes(), 24 * kMiB);  // at most what this call used
  {
    Workspace ws;
    ws.take<char>(3 * kMiB);  // 8 MiB would waste more than a quarter: a miss, not a hit
    EXPECT_EQ(cached_workspace_bytes(), 0u);
  }
  release_cached_workspace();
}

TEST(Workspace, ThreadsShareTheCacheSafely) {
  release_cached_workspace();
  std::vector<std::thread> threads;
  std::vector<int> bad(4, 0);
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([t, &bad] {
      for (int call = 0; call < 50; ++call) {
        Workspace ws;
        const size_t n = (2 + (call + t) % 3) * kMiB / sizeof(int);
        int* a = ws.take<int>(n);
        int* b = ws.take<int>(n);
        for (size_t i = 0; i < n; i += 1024) a[i] = b[i] = t * 1000 + call;
        std::this_thread::yield();
        for (size_t i = 0; i < n; i += 1024) bad[t] += a[i] != t * 1000 + call || b[i] != t * 1000 + call;
      }
    });
  for (auto& th : threads) th.join();
  for (int t = 0; t < 4; ++t) EXPECT_EQ(bad[t], 0) << "thread " << t << " saw another's writes";
  release_cached_workspace();
  EXPECT_EQ(cached_workspace_bytes(), 0u);
}

}  // namespace
}  // namespace ringattn::kernels::cpu
