// RoPE arithmetic on its own: per-document positions (empty documents included), the inverse
// frequencies with Llama 3 scaling against the formula, and a rotation undone by its inverse.
#include "runtime/lora/rope.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <numbers>

#include "tests/support/test_util.hpp"

namespace ringattn {
namespace {

TEST(Rope, PerDocumentPositionsRestartAtEachDocument) {
  const std::vector<int64_t> global{0, 3, 4, 5, 9, 10, 11};
  const std::vector<int64_t> offsets{0, 4, 4, 10, 12};  // documents 4, 0, 6, 2
  EXPECT_EQ(rope_positions(global, offsets, true), (std::vector<int64_t>{0, 3, 0, 1, 5, 0, 1}));
  EXPECT_EQ(rope_positions(global, offsets, false), global);
}

TEST(Rope, Llama3ScalingFollowsTheFormula) {
  RopeConfig rope;
  rope.theta = 500000.0, rope.llama3_factor = 8.0, rope.llama3_low_freq_factor = 1.0;
  rope.llama3_high_freq_factor = 4.0, rope.llama3_original_max_positions = 8192;
  const std::vector<double> inv = rope_inverse_frequencies(rope, 128);
  ASSERT_EQ(inv.size(), 64u);
  for (size_t i = 0; i < inv.size(); ++i) {
    const double f = std::pow(500000.0, -2.0 * double(i) / 128.0), wavelen = 2 * std::numbers::pi / f;
    double want = f;  // short wavelengths kept
    if (wavelen > 8192.0) want = f / 8.0;  // long ones divided by the factor
    else if (wavelen >= 2048.0) {
      const double smooth = (8192.0 / wavelen - 1.0) / 3.0;
      want = (1 - smooth) * f / 8.0 + smooth * f;
    }
    EXPECT_NEAR(inv[i], want, 1e-15 * want) << i;
  }
  EXPECT_EQ(inv[0], 1.0);  // the fastest plane is untouched
}

TEST(Rope, InverseRotationUndoesTheRotation) {
  for (bool interleaved : {false, true}) {
    RopeConfig rope;
    rope.theta = 10000.0, rope.interleaved = interleaved, rope.dims = 8;
    const std::vector<int64_t> pos{0, 7, 1000, 123456};
    const RopeTable table(rope, 16, pos);
    const std::vector<float> x = testing::random_vector(2 * pos.size() * 3 * 16, 4);
    std::vector<float> y = x;
    table.apply(y.data(), 2, 3, false);
    for (size_t r = 0; r < 2 * pos.size() * 3; ++r)  // dims past --rope-dims are untouched
      for (size_t e = 8; e < 16; ++e) EXPECT_EQ(y[r * 16 + e], x[r * 16 + e]);
    EXPECT_NE(y, x);
    table.apply(y.data(), 2, 3, true);
    for (size_t i = 0; i < x.size(); ++i) EXPECT_NEAR(y[i], x[i], 1e-5f) << i;
  }
}

}  // namespace
}  // namespace ringattn
