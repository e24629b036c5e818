// The masks the multi-rank tests sweep: each kind on its own and combined, including block rows
// that see no key, over blocks of 16 positions.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "kernels/mask/mask.hpp"

namespace ringattn::testing {

inline constexpr int kMaskVariants = 9;

inline Mask mask_variant(int variant, int64_t L) {
  Mask m;
  const int64_t n = (L + 15) / 16;
  switch (variant) {
    case 0: break;
    case 1: m.causal = true; break;
    case 2: m.window_left = 9; m.window_right = 4; break;
    case 3: m.causal = true; m.window_left = 40; break;
    case 4: m.set_documents({L / 3, 0, L - L / 3 - 7, 7}); break;
    case 5: m.causal = true; m.set_documents({L / 2, L - L / 2}); break;
    case 6: m.set_block_mask(bigbird_block_mask(n, 1, 1, 1, 11), n, 16); break;
    case 7: {  // causal + window + documents + a random block mask: everything at once
      std::mt19937 gen(5);
      std::vector<uint8_t> bm(static_cast<size_t>(n * n));
      for (auto& x : bm) x = gen() % 3 != 0;
      m.set_block_mask(bm, n, 16);
      m.causal = true;
      m.window_left = 50;
      m.set_documents({L - 30, 30});
      break;
    }
    case 8: {  // causal + a block mask whose second block row is empty: rows that see no key
      std::vector<uint8_t> bm(static_cast<size_t>(n * n), 1);
      for (int64_t j = 0; j < n; ++j) bm[static_cast<size_t>(n + j)] = 0;
      m.set_block_mask(bm, n, 16);
      m.causal = true;
      break;
    }
  }
  return m;
}

}  // namespace ringattn::testing
