// The masks the multi-rank tests sweep: each kind on its own and combined, including block rows
// that see no key, over blocks of 16 positions. Written as the library's MaskSpec; the Mask of a
// variant is the one the library builds from it.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "kernels/mask/mask.hpp"
#include "ringattn/ringattn.hpp"
#include "runtime/api/arguments.hpp"

namespace ringattn::testing {

inline constexpr int kMaskVariants = 9;

inline MaskSpec mask_spec_variant(int variant, int64_t L) {
  MaskSpec m;
  m.mask_block = 16;
  const int64_t n = (L + 15) / 16;
  switch (variant) {
    case 0: break;
    case 1: m.causal = true; break;
    case 2: m.window_left = 9; m.window_right = 4; break;
    case 3: m.causal = true; m.window_left = 40; break;
    case 4: m.doc_lens = {L / 3, 0, L - L / 3 - 7, 7}; break;
    case 5: m.causal = true; m.doc_lens = {L / 2, L - L / 2}; break;
    case 6: m.bigbird_global = 1, m.bigbird_window = 1, m.bigbird_random = 1, m.bigbird_seed = 11; break;
    case 7: {  // causal + window + documents + a random block mask: everything at once
      std::mt19937 gen(5);
      m.block_mask.resize(static_cast<size_t>(n * n));
      for (auto& x : m.block_mask) x = gen() % 3 != 0;
      m.causal = true;
      m.window_left = 50;
      m.doc_lens = {L - 30, 30};
      break;
    }
    case 8: {  // causal + a block mask whose second block row is empty: rows that see no key
      m.block_mask.assign(static_cast<size_t>(n * n), 1);
      for (int64_t j = 0; j < n; ++j) m.block_mask[static_cast<size_t>(n + j)] = 0;
      m.causal = true;
      break;
    }
  }
  return m;
}

inline AttentionSpec spec_variant(int variant, int64_t L) {
  AttentionSpec spec;
  spec.mask = mask_spec_variant(variant, L);
  return spec;
}

inline Mask mask_variant(int variant, int64_t L) { return api::build_mask(spec_variant(variant, L), L); }

}  // namespace ringattn::testing
