// The sharded KV cache: placement of appended tokens, storage, and the capacity check.
#include "runtime/inference/kv_cache.hpp"

#include <string>

namespace ringattn::inference {

std::optional<ArgumentError> check_cache_shape(const CacheShape& s) {
  auto positive = [](const char* name, int64_t v) -> std::optional<ArgumentError> {
    if (v >= 1) return std::nullopt;
    return ArgumentError(name, std::string("{") + name + "} " + std::to_string(v) + " must be positive");
  };
  if (auto e = positive("batch", s.batch)) return e;
  if (auto e = positive("kv_heads", s.kv_heads)) return e;
  if (auto e = positive("capacity", s.capacity)) return e;
  if (auto e = positive("interleave", s.interleave)) return e;
  if (s.head_dim < 16 || s.head_dim > 512 || s.head_dim % 16 != 0)
    return ArgumentError("head_dim", "{head_dim} " + std::to_string(s.head_dim) +
                                         " is not supported by the decode kernel (multiples of 16 up to 512)");
  if (s.dtype != DType::f32 && s.dtype != DType::bf16)
    return ArgumentError("dtype", std::string("{dtype} ") + dtype_name(s.dtype) + ": the cache holds fp32 or bf16",
                         ArgumentError::Kind::type);
  return std::nullopt;
}

KVCache::KVCache(AttentionBackend& backend, int rank, int ranks, const CacheShape& shape)
    : backend_(backend), rank_(rank), ranks_(ranks), shape_(shape) {
  if (auto e = check_cache_shape(shape)) throw *e;
  if (auto e = backend.decode_problem(shape.head_dim)) throw *e;
  const size_t bytes = size_t(shape.batch * shape.kv_heads * shape.capacity) * row_bytes();
  k_ = DeviceBuffer(backend, bytes);
  v_ = DeviceBuffer(backend, bytes);
  if (backend.memory() == comm::MemorySpace::device)
    device_pos_ = DeviceBuffer(backend, size_t(shape.batch * shape.capacity) * sizeof(int64_t));
  workspace_ = DeviceBuffer(backend, backend.decode_workspace_bytes(shape.head_dim));
  lengths_.assign(size_t(shape.batch), 0);
  positions_.assign(size_t(shape.batch), {});
  counts_.assign(size_t(shape.batch), std::vector<int64_t>(size_t(ranks), 0));
  unit_rank_.assign(size_t(shape.batch), ranks - 1);  // the first unit goes to rank 0
  unit_left_.assign(size_t(shape.batch), 0);
}

size_t KVCache::row_bytes() const { return size_t(shape_.head_dim * dtype_bytes(shape_.dtype)); }

int64_t KVCache::rows(int64_t seq, int on_rank) const {
  return counts_[size_t(seq)][size_t(on_rank < 0 ? rank_ : on_rank)];
}

char* KVCache::row_address(const DeviceBuffer& buffer, int64_t seq, int64_t head, int64_t row) const {
  return buffer.as<char>() + size_t((seq * shape_.kv_heads + head) * shape_.capacity + row) * row_bytes();
}
const void* KVCache::k(int64_t seq) const { return row_address(k_, seq, 0, 0); }
const void* KVCache::v(int64_t seq) const { return row_address(v_, seq, 0, 0); }
const int64_t* KVCache::backend_positions(int64_t seq) const {
  if (!device_pos_.data()) return positions_[size_t(seq)].data();
  return device_pos_.as<int64_t>() + seq * shape_.capacity;
}

void KVCache::mirror_positions(int64_t seq, int64_t from) {
  const std::vector<int64_t>& mine = positions_[size_t(seq)];
  if (!device_pos_.data() || int64_t(mine.size()) <= from) return;
  backend_.upload(device_pos_.as<int64_t>() + seq * shape_.capacity + from, mine.data() + from,
                  (mine.size() - size_t(from)) * sizeof(int64_t));
}

void* KVCache::scratch(size_t bytes) {
  if (scratch_.bytes() < bytes) {
    scratch_ = DeviceBuffer();  // the old one first: at most one is held
    scratch_ = DeviceBuffer(backend_, bytes);
  }
  return scratch_.data();
}

std::vector<int> KVCache::placement(int64_t seq, int64_t tokens) const {
  std::vector<int64_t> counts = counts_[size_t(seq)];
  int unit_rank = unit_rank_[size_t(seq)];
  int64_t unit_left = unit_left_[size_t(seq)];
  std::vector<int> owners;
  owners.reserve(size_t(tokens));
  for (int64_t t = 0; t < tokens; ++t) {
    if (unit_left == 0) {
      int best = -1;
      for (int i = 1; i <= ranks_; ++i) {  // from the rank after the last unit's, cyclically
        const int r = (unit_rank + i) % ranks_;
        if (best < 0 || counts[size_t(r)] < counts[size_t(best)]) best = r;
      }
      unit_rank = best;
      unit_left = shape_.interleave;
    }
    owners.push_back(unit_rank);
    ++counts[size_t(unit_rank)];
    --unit_left;
  }
  return owners;
}

std::optional<ArgumentError> KVCache::capacity_problem(int64_t seq, const std::vector<int64_t>& rows_per_rank,
                                                       const char* argument) const {
  for (int r = 0; r < ranks_; ++r) {
    const int64_t held = counts_[size_t(seq)][size_t(r)], added = rows_per_rank[size_t(r)];
    if (held + added <= shape_.capacity) continue;
    std::string message = "{";
    message += argument;
    message += "}: the new tokens would put " + std::to_string(held + added) + " rows of sequence " +
               std::to_string(seq) + " on rank " + std::to_string(r) + ", past the cache's capacity " +
               std::to_string(shape_.capacity) + " (it holds " + std::to_string(held) + ")";
    return ArgumentError(argument, message);
  }
  return std::nullopt;
}

void KVCache::append_placed(int64_t seq, int owner, int64_t position, const void* k_row, const void* v_row) {
  // Advance the unit exactly as placement() does.
  if (unit_left_[size_t(seq)] == 0) {
    unit_rank_[size_t(seq)] = owner;
    unit_left_[size_t(seq)] = shape_.interleave;
  }
  --unit_left_[size_t(seq)];
  if (owner == rank_) {
    const int64_t j = int64_t(positions_[size_t(seq)].size());
    const size_t rb = row_bytes();
    for (int64_t g = 0; g < shape_.kv_heads; ++g) {
      backend_.copy(row_address(k_, seq, g, j), static_cast<const char*>(k_row) + size_t(g) * rb, rb);
      backend_.copy(row_address(v_, seq, g, j), static_cast<const char*>(v_row) + size_t(g) * rb, rb);
    }
    positions_[size_t(seq)].push_back(position);
    mirror_positions(seq, j);
  }
  ++counts_[size_t(seq)][size_t(owner)];
  filled_ = true;
}

void KVCache::store_rows(int64_t seq, const std::vector<int64_t>& positions, const void* k, const void* v) {
  auto& mine = positions_[size_t(seq)];
  const int64_t j0 = int64_t(mine.size()), n = int64_t(positions.size());
  const size_t rb = row_bytes(), src_row = rb * size_t(shape_.kv_heads);
  // Each head's rows are consecutive in the cache: one strided copy per head.
  for (int64_t g = 0; g < shape_.kv_heads && n > 0; ++g) {
    backend_.copy_2d(row_address(k_, seq, g, j0), rb, static_cast<const char*>(k) + size_t(g) * rb, src_row, rb,
                     size_t(n));
    backend_.copy_2d(row_address(v_, seq, g, j0), rb, static_cast<const char*>(v) + size_t(g) * rb, src_row, rb,
                     size_t(n));
  }
  backend_.synchronize();
  mine.insert(mine.end(), positions.begin(), positions.end());
  mirror_positions(seq, j0);
}

void KVCache::commit_rows(int64_t seq, const std::vector<int64_t>& rows_per_rank, int64_t new_length) {
  for (int r = 0; r < ranks_; ++r) counts_[size_t(seq)][size_t(r)] += rows_per_rank[size_t(r)];
  unit_left_[size_t(seq)] = 0;  // decode starts a new unit
  lengths_[size_t(seq)] = new_length;
  filled_ = true;
}

}  // namespace ringattn::inference
