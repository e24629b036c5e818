#include "kernels/mask/mask.hpp"

#include <algorithm>
#include <stdexcept>
#include <utility>

namespace ringattn {

void Mask::set_documents(const std::vector<int64_t>& lengths) {
  doc_offsets_.assign(1, 0);
  for (int64_t n : lengths) doc_offsets_.push_back(doc_offsets_.back() + n);
}

void Mask::set_block_mask(std::vector<uint8_t> mask, int64_t n, int64_t block) {
  if (static_cast<int64_t>(mask.size()) != n * n) throw std::invalid_argument("block mask must be n x n");
  block_mask_ = std::move(mask);
  block_count_ = n;
  mask_block_ = block;
  index_ = BlockMaskIndex(block_mask_.data(), n);
}

MaskView Mask::view() const {
  MaskView v;
  v.causal = causal;
  v.window_left = window_left;
  v.window_right = window_right;
  if (has_documents()) {
    v.doc_offsets = doc_offsets_.data();
    v.num_docs = static_cast<int64_t>(doc_offsets_.size()) - 1;
  }
  if (has_block_mask()) {
    v.block_mask = block_mask_.data();
    v.block_count = block_count_;
    v.mask_block = mask_block_;
    index_.attach(v);
  }
  return v;
}

std::string Mask::describe() const {
  std::string s;
  auto add = [&](const std::string& part) { s += (s.empty() ? "" : "+") + part; };
  if (causal) add("causal");
  if (window_left >= 0 || window_right >= 0)
    add("window(" + (window_origin.empty() ? std::to_string(window_left) + "," + std::to_string(window_right)
                                            : window_origin) + ")");
  if (has_documents()) add("docs(" + std::to_string(doc_offsets_.size() - 1) + ")");
  if (has_block_mask()) add(block_mask_origin + "[" + std::to_string(mask_block_) + "]");
  return s.empty() ? "none" : s;
}

namespace {
// splitmix64: a tiny, well-mixed generator whose output is fixed by its definition, so a
// BigBird mask is the same on every rank, compiler and platform.
uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
}  // namespace

std::vector<uint8_t> bigbird_block_mask(int64_t blocks, int64_t global, int64_t window, int64_t random,
                                        uint64_t seed) {
  std::vector<uint8_t> m(static_cast<size_t>(blocks * blocks), 0);
  for (int64_t r = 0; r < blocks; ++r) {
    uint8_t* row = &m[static_cast<size_t>(r * blocks)];
    for (int64_t c = 0; c < blocks; ++c) {
      const bool is_global = r < global || c < global;
      const bool in_window = c >= r - window && c <= r + window;
      row[c] = is_global || in_window;
    }
  }
  std::vector<int64_t> unseen;
  for (int64_t r = 0; r < blocks; ++r) {
    uint8_t* row = &m[static_cast<size_t>(r * blocks)];
    unseen.clear();
    for (int64_t c = 0; c < blocks; ++c)
      if (!row[c]) unseen.push_back(c);
    uint64_t state = seed ^ (0x5851f42d4c957f2dull * static_cast<uint64_t>(r + 1));
    // Partial Fisher-Yates: the first `random` entries become a uniform draw without replacement.
    const int64_t draws = std::min<int64_t>(random, static_cast<int64_t>(unseen.size()));
    for (int64_t k = 0; k < draws; ++k) {
      const uint64_t span = unseen.size() - static_cast<uint64_t>(k);
      const int64_t pick = k + static_cast<int64_t>(splitmix64(state) % span);
      std::swap(unseen[k], unseen[pick]);
      row[unseen[k]] = 1;
    }
  }
  return m;
}

}  // namespace ringattn
