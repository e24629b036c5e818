// The attention mask of a job, owning its data (docs/reference.md "Masks"): built from the options,
// handed to kernels and plans as a MaskView.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/mask/block_mask_index.hpp"
#include "kernels/mask/mask_view.hpp"

namespace ringattn {

class Mask {
 public:
  Mask() = default;

  bool causal = false;
  int64_t window_left = kUnboundedWindow;
  int64_t window_right = kUnboundedWindow;

  // Packed documents of these lengths (summing to the sequence length). Empty = one document.
  void set_documents(const std::vector<int64_t>& lengths);
  // (n x n) block mask over blocks of `block` positions, nonzero = visible.
  void set_block_mask(std::vector<uint8_t> mask, int64_t n, int64_t block);

  bool has_documents() const { return !doc_offsets_.empty(); }
  bool has_block_mask() const { return !block_mask_.empty(); }
  const std::vector<int64_t>& doc_offsets() const { return doc_offsets_; }
  const std::vector<uint8_t>& block_mask() const { return block_mask_; }
  int64_t block_count() const { return block_count_; }
  int64_t mask_block() const { return mask_block_; }

  MaskView view() const;
  // "none", "causal", "causal+window(4096,-1)", "docs(3)", "block(128)", joined with '+'.
  std::string describe() const;
  // Human-readable name for the block mask's origin (e.g. "bigbird(2,3,1)"); set by the loader.
  std::string block_mask_origin = "block";
  // The window as the user gave it ("4096,-1"), for describe(): window_left/right hold it clamped
  // to the sequence length. Empty: describe() shows window_left/right.
  std::string window_origin;

 private:
  std::vector<int64_t> doc_offsets_;
  std::vector<uint8_t> block_mask_;
  int64_t block_count_ = 0;
  int64_t mask_block_ = 128;
  BlockMaskIndex index_;
};

// BigBird block mask (docs/reference.md "Masks"): the first `global` blocks attend to and are attended by all;
// every block sees `window` blocks on each side; each block row draws `random` more blocks
// among those it does not already see, from a generator seeded by `seed` (same on every rank).
std::vector<uint8_t> bigbird_block_mask(int64_t blocks, int64_t global, int64_t window, int64_t random,
                                        uint64_t seed);

}  // namespace ringattn
