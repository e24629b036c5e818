// The CPU kernels' per-call workspace: aligned, writable arrays of every size, including the
// huge-page-advised mappings of 2 MiB and more.
#include "kernels/cpu/workspace.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <numeric>
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

}  // namespace
}  // namespace ringattn::kernels::cpu
