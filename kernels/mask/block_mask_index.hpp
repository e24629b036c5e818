// Run-length index of a block mask, so that kernels and plans visit only the blocks a block row
// (or column) actually sees: O(nonzeros) instead of O(blocks^2) work per sweep.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/mask/mask_view.hpp"

namespace ringattn {

class BlockMaskIndex {
 public:
  BlockMaskIndex() = default;
  // `dense` is (n x n) row-major, nonzero = visible.
  BlockMaskIndex(const uint8_t* dense, int64_t n);

  // Points the view's run fields at this index (which must outlive the view).
  void attach(MaskView& view) const;

  int64_t blocks() const { return n_; }
  int64_t nonzeros() const { return nonzeros_; }

 private:
  static void build_runs(const uint8_t* dense, int64_t n, bool transpose, std::vector<int64_t>& ptr,
                         std::vector<int32_t>& runs);
  int64_t n_ = 0;
  int64_t nonzeros_ = 0;
  std::vector<int64_t> row_ptr_, col_ptr_;
  std::vector<int32_t> row_runs_, col_runs_;
};

}  // namespace ringattn
