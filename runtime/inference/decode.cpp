// Decode: the checks, the placement of the new rows, each rank's partial states, the merge.
#include "runtime/inference/decode.hpp"

#include <string>

#include "kernels/cpu/decode_cpu.hpp"
#include "util/stopwatch.hpp"

namespace ringattn::inference {

std::vector<int64_t> sequences_of(const KVCache& cache, const std::vector<int64_t>& given) {
  if (!given.empty()) return given;
  std::vector<int64_t> all(size_t(cache.shape().batch));
  for (size_t i = 0; i < all.size(); ++i) all[i] = int64_t(i);
  return all;
}

std::optional<ArgumentError> check_decode(const KVCache& cache, const DecodeRequest& r) {
  if (!r.prefill && !cache.filled())
    return ArgumentError("cache", "{cache} was never filled: prefill it (or append a first token) before decode");
  if (r.tokens < 1)
    return ArgumentError("tokens", "{tokens} " + std::to_string(r.tokens) + " new tokens: must be at least 1");
  const std::vector<int64_t> seqs = sequences_of(cache, r.sequences);
  const int64_t B = cache.shape().batch;
  std::vector<uint8_t> seen(size_t(B), 0);
  for (size_t i = 0; i < seqs.size(); ++i) {
    const int64_t s = seqs[i];
    if (s < 0 || s >= B)
      return ArgumentError("sequences", "{sequences}[" + std::to_string(i) + "] " + std::to_string(s) +
                                            " is out of range: the cache holds " + std::to_string(B) + " sequences");
    if (seen[size_t(s)]++)
      return ArgumentError("sequences", "{sequences} names sequence " + std::to_string(s) + " twice");
  }
  if (!r.positions.empty() && r.positions.size() != seqs.size())
    return ArgumentError("positions", "{positions} has " + std::to_string(r.positions.size()) + " entries for " +
                                          std::to_string(seqs.size()) + " sequences");
  for (size_t i = 0; i < r.positions.size(); ++i)
    if (r.positions[i] != cache.length(seqs[i]))
      return ArgumentError("positions", "{positions}[" + std::to_string(i) + "] " + std::to_string(r.positions[i]) +
                                            " is not sequence " + std::to_string(seqs[i]) + "'s next position " +
                                            std::to_string(cache.length(seqs[i])));
  for (int64_t s : seqs) {
    std::vector<int64_t> added(size_t(cache.ranks()), 0);
    for (int owner : cache.placement(s, r.tokens)) ++added[size_t(owner)];
    if (auto e = cache.capacity_problem(s, added, "capacity")) return e;
  }
  return std::nullopt;
}

comm::Communicator& states_communicator(Session& session) {
  return session.backend().memory() == comm::MemorySpace::device ? session.transport() : session.world();
}

DecodeStats decode_step(Session& session, KVCache& cache, const DecodeRequest& r, const void* q, const void* k,
                        const void* v, float* o, float* lse) {
  if (auto e = check_decode(cache, r)) throw *e;
  Stopwatch total;
  DecodeStats stats;
  const CacheShape& shape = cache.shape();
  const int64_t T = r.tokens, H = r.heads, Hkv = shape.kv_heads, D = shape.head_dim;
  const std::vector<int64_t> seqs = sequences_of(cache, r.sequences);
  const int64_t n = int64_t(seqs.size());
  AttentionBackend& backend = cache.backend();
  // The merge's temporaries now, before any transfer of the call.
  void* scratch = cache.scratch(merge_scratch_bytes(session.size(), n, T, H, D));
  const size_t eb = size_t(dtype_bytes(shape.dtype));
  const size_t q_token = size_t(H * D) * eb, kv_token = size_t(Hkv * D) * eb;

  // Every rank advances its table; the owner stores the rows.
  std::vector<std::vector<int64_t>> new_pos(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    const int64_t s = seqs[size_t(i)], first = cache.length(s);
    const std::vector<int> owners = cache.placement(s, T);
    for (int64_t t = 0; t < T; ++t) {
      const size_t at = size_t(i * T + t) * kv_token;
      cache.append_placed(s, owners[size_t(t)], first + t, static_cast<const char*>(k) + at,
                          static_cast<const char*>(v) + at);
      new_pos[size_t(i)].push_back(first + t);
    }
    cache.set_length(s, first + T);
  }

  const kernels::AttentionDims dims{1, H, Hkv, D, r.scale};
  Stopwatch compute;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t s = seqs[size_t(i)];
    const kernels::DecodeQueries queries{static_cast<const char*>(q) + size_t(i * T) * q_token, shape.dtype, T,
                                         new_pos[size_t(i)].data()};
    const kernels::CachedKeyValues rows{cache.k(s), cache.v(s), shape.dtype, cache.rows(s), shape.capacity,
                                        cache.positions(s).data()};
    const uint64_t bytes = kernels::decode_bytes_read(dims, rows, r.window_left, queries);
    stats.bytes_read += bytes;
    stats.computed = stats.computed || bytes > 0;
    backend.decode(dims, queries, rows, cache.backend_positions(s), r.window_left,
                   kernels::AttentionState{o + i * T * H * D, lse + i * H * T}, cache.workspace(), r.threads);
  }
  backend.synchronize();
  stats.compute_seconds = compute.seconds();
  Stopwatch merge;
  stats.merge =
      merge_across_ranks(session.world(), states_communicator(session), backend, scratch, n, T, H, D, stats.computed,
                         o, lse);
  stats.merge_seconds = merge.seconds();
  stats.seconds = total.seconds();
  return stats;
}

}  // namespace ringattn::inference
