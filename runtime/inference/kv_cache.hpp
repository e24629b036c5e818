// One layer's KV cache sharded across the ranks (docs/reference.md "Inference"): each rank holds its share of
// each sequence's K/V rows with their global positions, never a whole sequence.
//
// Placement. A prefill through the ring (pass-KV) leaves each rank the rows it computed: its rows
// of the prompt's layout. Tokens appended one by one (decode, and a pass-Q prefill, whose chunk
// every rank holds) go in units of `interleave` consecutive tokens, each unit to the rank that
// holds the fewest rows of that sequence (ties: the next rank after the last unit's, cyclically).
// From equal shares this is round-robin (vLLM's and SGLang's position p on rank p mod N, for
// interleave 1), and from unequal ones it evens them out first, so shares end up differing by at
// most one unit. Every rank keeps every rank's counts (batch x ranks integers), so all ranks agree
// on where a token goes, and on whether it fits, without a message.
//
// Storage is head-major per sequence, (batch, Hkv, capacity, D): one head's rows are contiguous,
// so the decode kernel streams them. Memory is capacity rows per sequence on each rank: sized for
// the rank's share, not the sequence. The rows live in the backend's memory (the GPU's with the
// CUDA backend); the positions on the host, and mirrored on the device for its kernel. The
// decode kernel's workspace is allocated with the cache; the merge's buffers grow to a call's
// shape before the call's first transfer, and are kept.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "ringattn/errors.hpp"
#include "runtime/backend.hpp"
#include "util/dtype.hpp"

namespace ringattn::inference {

struct CacheShape {
  int64_t batch = 1;
  int64_t kv_heads = 1;
  int64_t head_dim = 64;
  int64_t capacity = 0;  // rows per sequence on each rank
  int64_t interleave = 1;
  DType dtype = DType::f32;
};

// Why the shape cannot make a cache (an ArgumentError naming the field), or nothing.
std::optional<ArgumentError> check_cache_shape(const CacheShape& shape);

class KVCache {
 public:
  KVCache(AttentionBackend& backend, int rank, int ranks, const CacheShape& shape);

  const CacheShape& shape() const { return shape_; }
  int rank() const { return rank_; }
  int ranks() const { return ranks_; }
  // Tokens cached per sequence: the whole sequence's, the same on every rank.
  const std::vector<int64_t>& lengths() const { return lengths_; }
  int64_t length(int64_t seq) const { return lengths_[size_t(seq)]; }
  // Whether any token was ever stored.
  bool filled() const { return filled_; }
  // Rows of sequence `seq` on a rank (default: this one).
  int64_t rows(int64_t seq, int on_rank = -1) const;
  // This rank's rows of a sequence: global positions (ascending; host memory, and their copy in
  // backend memory), and K and V head-major (head g's row j at k(seq) + (g * capacity + j) * D
  // elements), in backend memory.
  const std::vector<int64_t>& positions(int64_t seq) const { return positions_[size_t(seq)]; }
  const int64_t* backend_positions(int64_t seq) const;
  const void* k(int64_t seq) const;
  const void* v(int64_t seq) const;
  size_t row_bytes() const;  // one row of one head: D elements
  size_t bytes() const { return k_.bytes() + v_.bytes(); }
  AttentionBackend& backend() const { return backend_; }
  // The decode kernel's workspace (backend memory), and backend memory of at least `bytes` for a
  // call's temporaries (grown, never shrunk; the same buffer on every call).
  void* workspace() const { return workspace_.data(); }
  void* scratch(size_t bytes);

  // The ranks that would hold `tokens` tokens appended now to sequence `seq`, in order.
  std::vector<int> placement(int64_t seq, int64_t tokens) const;
  // Why appending `rows_per_rank[r]` rows to sequence `seq` on each rank r does not fit: an
  // ArgumentError naming `argument`, the same on every rank.
  std::optional<ArgumentError> capacity_problem(int64_t seq, const std::vector<int64_t>& rows_per_rank,
                                                const char* argument) const;

  // Appends token t of a run placed by placement(): every rank calls it for every token (its
  // counts advance), only the owner stores k_row and v_row ((Hkv, D) in the cache's dtype, in
  // backend memory).
  void append_placed(int64_t seq, int owner, int64_t position, const void* k_row, const void* v_row);
  // Stores rows a ring prefill (or a fill) left this rank after its others: positions ascending,
  // after every cached one, k and v (rows, Hkv, D) in backend memory. The table is unchanged
  // until commit_rows.
  void store_rows(int64_t seq, const std::vector<int64_t>& positions, const void* k, const void* v);
  // Every rank's rows stored since the last commit (the same call on every rank), and the length.
  void commit_rows(int64_t seq, const std::vector<int64_t>& rows_per_rank, int64_t new_length);
  // Sets the length after appending (all ranks the same).
  void set_length(int64_t seq, int64_t length) { lengths_[size_t(seq)] = length; }

 private:
  char* row_address(const DeviceBuffer& buffer, int64_t seq, int64_t head, int64_t row) const;
  AttentionBackend& backend_;
  int rank_, ranks_;
  CacheShape shape_;
  // Copies positions [from, end) of `seq` to the backend's mirror (none on the host).
  void mirror_positions(int64_t seq, int64_t from);
  DeviceBuffer k_, v_;
  DeviceBuffer device_pos_;  // (batch, capacity) positions, with a device backend only
  DeviceBuffer workspace_, scratch_;
  std::vector<int64_t> lengths_;
  std::vector<std::vector<int64_t>> positions_;  // this rank's, per sequence
  std::vector<std::vector<int64_t>> counts_;     // [seq][rank] rows held
  std::vector<int> unit_rank_;                   // [seq] the rank of the current unit
  std::vector<int64_t> unit_left_;               // [seq] tokens the current unit still takes
  bool filled_ = false;
};

}  // namespace ringattn::inference
