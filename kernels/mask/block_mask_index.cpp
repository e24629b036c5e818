#include "kernels/mask/block_mask_index.hpp"

namespace ringattn {

BlockMaskIndex::BlockMaskIndex(const uint8_t* dense, int64_t n) : n_(n) {
  for (int64_t i = 0; i < n * n; ++i) nonzeros_ += dense[i] != 0;
  build_runs(dense, n, false, row_ptr_, row_runs_);
  build_runs(dense, n, true, col_ptr_, col_runs_);
}

void BlockMaskIndex::build_runs(const uint8_t* dense, int64_t n, bool transpose, std::vector<int64_t>& ptr,
                                std::vector<int32_t>& runs) {
  ptr.assign(static_cast<size_t>(n) + 1, 0);
  runs.clear();
  for (int64_t r = 0; r < n; ++r) {
    int64_t c = 0;
    while (c < n) {
      auto at = [&](int64_t col) { return transpose ? dense[col * n + r] : dense[r * n + col]; };
      while (c < n && !at(c)) ++c;
      if (c == n) break;
      int64_t c0 = c;
      while (c < n && at(c)) ++c;
      runs.push_back(static_cast<int32_t>(c0));
      runs.push_back(static_cast<int32_t>(c));
    }
    ptr[r + 1] = static_cast<int64_t>(runs.size() / 2);
  }
}

void BlockMaskIndex::attach(MaskView& view) const {
  view.row_run_ptr = row_ptr_.data();
  view.row_runs = row_runs_.data();
  view.col_run_ptr = col_ptr_.data();
  view.col_runs = col_runs_.data();
}

}  // namespace ringattn
