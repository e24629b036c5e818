// Prefill: the rule, the checks, pass-KV (the ring, then the cached shares sent round) and pass-Q
// (decode's computation over the whole chunk; gathered first when auto picked it).
#include "runtime/inference/prefill.hpp"

#include <algorithm>
#include <cstring>

#include "runtime/api/arguments.hpp"
#include "util/stopwatch.hpp"

namespace ringattn::inference {

namespace {

// Point-to-point tag of the cached shares' transfers (below the communicator's reserved ones).
constexpr int kCacheShareTag = 32765;

AttentionSpec chunk_spec(const PrefillRequest& r) {
  AttentionSpec spec;
  spec.mask.causal = true;
  spec.mask.window_left = r.window_left;
  spec.softmax_scale = r.scale;
  return spec;
}

// auto on a chunk of fewer tokens than ranks (no causal layout shards it): the whole chunk, pass-Q.
bool whole_chunk(const PrefillRequest& r, PrefillMethod method, int ranks) {
  return method == PrefillMethod::pass_q || (method == PrefillMethod::automatic && r.tokens < ranks);
}

PrefillMethod resolved(const KVCache& cache, const PrefillRequest& r, const std::vector<int64_t>& seqs, int ranks) {
  if (r.method != PrefillMethod::automatic) return r.method;
  if (r.tokens < ranks) return PrefillMethod::pass_q;
  int64_t cached = 0;
  for (int64_t s : seqs) cached = std::max(cached, cache.length(s));
  return choose_prefill_method(r.tokens, cached, r.heads, cache.shape().kv_heads, ranks);
}

// This rank's cached rows of the sequences, row-major (rows, Hkv, D) as the block kernel reads
// them: all K, then all V, then the positions, in backend memory.
DeviceBuffer pack_share(const KVCache& cache, const std::vector<int64_t>& seqs) {
  const CacheShape& sh = cache.shape();
  AttentionBackend& backend = cache.backend();
  const size_t rb = cache.row_bytes(), row = size_t(sh.kv_heads) * rb;
  size_t rows = 0;
  for (int64_t s : seqs) rows += size_t(cache.rows(s));
  DeviceBuffer out(backend, rows * (2 * row + sizeof(int64_t)));
  char* k = out.as<char>();
  char* v = k + rows * row;
  char* pos = v + rows * row;
  for (int64_t s : seqs) {
    const int64_t n = cache.rows(s);
    if (n == 0) continue;  // an empty share: nothing to copy (and no buffer to copy into)
    for (int64_t g = 0; g < sh.kv_heads; ++g) {  // head g's rows are consecutive in the cache
      const size_t from = size_t(g * sh.capacity) * rb;
      backend.copy_2d(k + size_t(g) * rb, row, static_cast<const char*>(cache.k(s)) + from, rb, rb, size_t(n));
      backend.copy_2d(v + size_t(g) * rb, row, static_cast<const char*>(cache.v(s)) + from, rb, rb, size_t(n));
    }
    k += size_t(n) * row, v += size_t(n) * row;
    backend.upload(pos, cache.positions(s).data(), size_t(n) * sizeof(int64_t));
    pos += size_t(n) * sizeof(int64_t);
  }
  backend.synchronize();
  return out;
}

size_t share_bytes(const KVCache& cache, const std::vector<int64_t>& seqs, int rank) {
  size_t rows = 0;
  for (int64_t s : seqs) rows += size_t(cache.rows(s, rank));
  return rows * (2 * size_t(cache.shape().kv_heads) * cache.row_bytes() + sizeof(int64_t));
}

PrefillStats pass_kv(Session& session, KVCache& cache, const PrefillRequest& r, const std::vector<int64_t>& seqs,
                     const void* q, const void* k, const void* v, float* o, float* lse) {
  PrefillStats stats;
  stats.method = PrefillMethod::pass_kv;
  const CacheShape& sh = cache.shape();
  const int64_t n = int64_t(seqs.size()), H = r.heads, Hkv = sh.kv_heads, D = sh.head_dim;
  const AttentionSpec spec = chunk_spec(r);
  Shard shard{n, 0, H, Hkv, D, api::element_type_of(sh.dtype)};
  AttentionPlan& plan = session.plan(shard, spec, r.tokens);
  const int64_t rows = plan.rows();
  // The chunk against itself: the ring, on positions within the chunk (a causal window depends
  // on differences only, so every sequence's offset is the same to it).
  const PassStats ring = plan.attention().forward(q, k, v, o, lse);
  stats.bytes_sent += ring.bytes_sent;

  // The chunk against every rank's cached share, one peer per step (over the backend's memory).
  comm::Communicator& world = states_communicator(session);
  AttentionBackend& backend = session.backend();
  const int P = world.size(), me = world.rank();
  const DeviceBuffer own = pack_share(cache, seqs);
  size_t most = 0;
  for (int p = 0; p < P; ++p) most = std::max(most, share_bytes(cache, seqs, p));
  DeviceBuffer in[2] = {DeviceBuffer(backend, P > 1 ? most : 0), DeviceBuffer(backend, P > 1 ? most : 0)};
  comm::Request recv[2], send[2];
  auto post = [&](int step) {
    if (step >= P) return;
    const int to = (me + step) % P, from = (me - step + P) % P;
    recv[step % 2] = world.irecv(in[step % 2].data(), share_bytes(cache, seqs, from), from, kCacheShareTag);
    send[step % 2] = world.isend(own.data(), own.bytes(), to, kCacheShareTag);
    stats.bytes_sent += own.bytes();
  };
  std::vector<std::vector<int64_t>> q_pos(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    q_pos[size_t(i)] = plan.positions();
    for (int64_t& p : q_pos[size_t(i)]) p += cache.length(seqs[size_t(i)]);
  }
  Mask mask;
  mask.causal = true;
  mask.window_left = r.window_left;
  const MaskView view = mask.view();
  const kernels::AttentionDims dims{1, H, Hkv, D, r.scale};
  const size_t eb = size_t(dtype_bytes(sh.dtype));
  for (int step = 0; step < P; ++step) {
    const int from = (me - step + P) % P;
    const char* block = own.as<char>();
    if (step > 0) {
      world.wait(recv[step % 2], "the cached share of rank " + std::to_string(from));
      block = in[step % 2].as<char>();
    }
    post(step + 1);  // the next transfer runs under this step's compute
    size_t total_rows = 0;
    for (int64_t s : seqs) total_rows += size_t(cache.rows(s, from));
    const char* kb = block;
    const char* vb = kb + total_rows * size_t(Hkv * D) * eb;
    // The block kernels take positions from the host.
    std::vector<int64_t> positions(total_rows);
    if (total_rows > 0)
      backend.download(positions.data(), vb + total_rows * size_t(Hkv * D) * eb, total_rows * sizeof(int64_t));
    const int64_t* pb = positions.data();
    for (int64_t i = 0; i < n; ++i) {
      const int64_t m = cache.rows(seqs[size_t(i)], from);
      if (m > 0 && rows > 0) {
        const kernels::QueryRows qr{static_cast<const char*>(q) + size_t(i * rows * H * D) * eb, sh.dtype, rows,
                                    q_pos[size_t(i)].data()};
        const kernels::KeyValueRows kv{kb, vb, sh.dtype, m, pb};
        backend.forward(dims, qr, kv, view, kernels::AttentionState{o + i * rows * H * D, lse + i * H * rows}, {});
      }
      kb += size_t(m * Hkv * D) * eb, vb += size_t(m * Hkv * D) * eb, pb += m;
    }
    if (step > 0) world.wait(send[step % 2], "the cached share to rank " + std::to_string((me + step) % P));
  }

  // The chunk's rows stay where they were computed.
  std::vector<int64_t> per_rank(static_cast<size_t>(P));
  for (int p = 0; p < P; ++p) per_rank[size_t(p)] = plan.layout().rows(p);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t s = seqs[size_t(i)];
    const size_t at = size_t(i * rows * Hkv * D) * eb;
    cache.store_rows(s, q_pos[size_t(i)], static_cast<const char*>(k) + at, static_cast<const char*>(v) + at);
    cache.commit_rows(s, per_rank, cache.length(s) + r.tokens);
  }
  return stats;
}

DecodeRequest as_decode(const PrefillRequest& r, const std::vector<int64_t>& seqs) {
  DecodeRequest d;
  d.heads = r.heads, d.tokens = r.tokens, d.scale = r.scale, d.window_left = r.window_left, d.threads = r.threads;
  d.sequences = seqs;
  d.prefill = true;
  return d;
}

// The whole chunk of (n, rows, width) elements from every rank's rows of the layout (`mine` and
// the result in backend memory; gathered through the host).
DeviceBuffer gather_chunk(Session& session, const ShardLayout& layout, int64_t n, size_t width, const void* mine) {
  AttentionBackend& backend = session.backend();
  const int P = session.size();
  std::vector<size_t> counts(static_cast<size_t>(P));
  for (int p = 0; p < P; ++p) counts[size_t(p)] = size_t(n * layout.rows(p)) * width;
  std::vector<char> own(counts[size_t(session.rank())]), all(size_t(n * layout.seq_len()) * width), chunk(all.size());
  if (!own.empty()) backend.download(own.data(), mine, own.size());
  session.world().allgatherv(own.data(), all.data(), counts);
  const char* src = all.data();
  for (int p = 0; p < P; ++p) {
    const std::vector<int64_t> pos = layout.positions(p);
    for (int64_t i = 0; i < n; ++i)
      for (int64_t pos_i : pos) {
        std::memcpy(chunk.data() + size_t(i * layout.seq_len() + pos_i) * width, src, width);
        src += width;
      }
  }
  DeviceBuffer out(backend, chunk.size());
  backend.upload(out.data(), chunk.data(), chunk.size());
  return out;
}

}  // namespace

const char* prefill_method_name(PrefillMethod m) {
  switch (m) {
    case PrefillMethod::pass_kv: return "pass-kv";
    case PrefillMethod::pass_q: return "pass-q";
    default: return "auto";
  }
}

PrefillMethod parse_prefill_method(const std::string& name) {
  if (name == "auto") return PrefillMethod::automatic;
  if (name == "pass-kv") return PrefillMethod::pass_kv;
  if (name == "pass-q") return PrefillMethod::pass_q;
  throw ArgumentError("method", "{method} '" + name + "': expected auto, pass-kv or pass-q");
}

PrefillMethod choose_prefill_method(int64_t new_tokens, int64_t cached, int64_t heads, int64_t kv_heads, int ranks) {
  // T / (T + P) >= 2 Hkv / H, in integers.
  if (new_tokens * heads >= 2 * kv_heads * (new_tokens + cached)) return PrefillMethod::pass_kv;
  if (new_tokens >= kPassKvHidingRows * ranks) return PrefillMethod::pass_kv;
  return PrefillMethod::pass_q;
}

int64_t prefill_rows(const Session& session, const PrefillRequest& r, PrefillMethod method) {
  if (whole_chunk(r, method, session.size())) return r.tokens;
  return session.layout(r.tokens, chunk_spec(r)).rows(session.rank());
}

std::vector<int64_t> prefill_chunk_positions(const Session& session, const PrefillRequest& r, PrefillMethod method) {
  if (whole_chunk(r, method, session.size())) {
    std::vector<int64_t> all(static_cast<size_t>(r.tokens));
    for (size_t i = 0; i < all.size(); ++i) all[i] = int64_t(i);
    return all;
  }
  return session.layout(r.tokens, chunk_spec(r)).positions(session.rank());
}

std::optional<ArgumentError> check_prefill(const Session& session, const KVCache& cache, const PrefillRequest& r) {
  if (r.tokens < 1)
    return ArgumentError("tokens", "{tokens} " + std::to_string(r.tokens) + " new tokens: must be at least 1");
  const std::vector<int64_t> seqs = sequences_of(cache, r.sequences);
  DecodeRequest d = as_decode(r, r.sequences);
  const PrefillMethod method = [&] {
    for (int64_t s : seqs)
      if (s < 0 || s >= cache.shape().batch) return PrefillMethod::pass_q;  // reported by check_decode
    return resolved(cache, r, seqs, session.size());
  }();
  if (method == PrefillMethod::pass_kv && r.tokens < session.size())
    return ArgumentError("method", "{method} pass-kv shards the chunk over the ranks: " + std::to_string(r.tokens) +
                                       " new tokens are fewer than the " + std::to_string(session.size()) +
                                       " ranks (use pass-q or auto)");
  if (method == PrefillMethod::pass_q) return check_decode(cache, d);
  d.tokens = 1;  // the sequence checks; the capacity is the layout's
  if (auto e = check_decode(cache, d)) {
    if (e->argument() != "capacity") return e;
  }
  const ShardLayout layout = session.layout(r.tokens, chunk_spec(r));
  std::vector<int64_t> per_rank(size_t(session.size()));
  for (int p = 0; p < session.size(); ++p) per_rank[size_t(p)] = layout.rows(p);
  for (int64_t s : seqs)
    if (auto e = cache.capacity_problem(s, per_rank, "capacity")) return e;
  return std::nullopt;
}

PrefillStats prefill(Session& session, KVCache& cache, const PrefillRequest& r, const void* q, const void* k,
                     const void* v, float* o, float* lse) {
  if (auto e = check_prefill(session, cache, r)) throw *e;
  Stopwatch clock;
  const std::vector<int64_t> seqs = sequences_of(cache, r.sequences);
  const PrefillMethod method = resolved(cache, r, seqs, session.size());
  PrefillStats stats;
  if (method == PrefillMethod::pass_kv) {
    stats = pass_kv(session, cache, r, seqs, q, k, v, o, lse);
  } else if (whole_chunk(r, r.method, session.size())) {
    const DecodeStats d = decode_step(session, cache, as_decode(r, seqs), q, k, v, o, lse);
    stats.method = PrefillMethod::pass_q;
    stats.bytes_sent = d.merge.bytes_moved / uint64_t(session.size());
  } else {
    // auto chose pass-Q for inputs sharded as pass-KV's: gather the chunk, run, keep this rank's rows.
    const CacheShape& sh = cache.shape();
    const int64_t n = int64_t(seqs.size()), H = r.heads, D = sh.head_dim, T = r.tokens;
    const size_t eb = size_t(dtype_bytes(sh.dtype));
    const ShardLayout layout = session.layout(T, chunk_spec(r));
    const DeviceBuffer qa = gather_chunk(session, layout, n, size_t(H * D) * eb, q);
    const DeviceBuffer ka = gather_chunk(session, layout, n, size_t(sh.kv_heads * D) * eb, k);
    const DeviceBuffer va = gather_chunk(session, layout, n, size_t(sh.kv_heads * D) * eb, v);
    AttentionBackend& backend = session.backend();
    DeviceBuffer oa(backend, size_t(n * T * H * D) * sizeof(float)), la(backend, size_t(n * H * T) * sizeof(float));
    const DecodeStats d = decode_step(session, cache, as_decode(r, seqs), qa.data(), ka.data(), va.data(),
                                      oa.as<float>(), la.as<float>());
    const std::vector<int64_t> mine = layout.positions(session.rank());
    const int64_t rows = int64_t(mine.size());
    std::vector<float> oh(size_t(n * T * H * D)), lh(size_t(n * H * T)), o_rows(size_t(n * rows * H * D)),
        lse_rows(size_t(n * H * rows));
    backend.download(oh.data(), oa.data(), oa.bytes());
    backend.download(lh.data(), la.data(), la.bytes());
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < rows; ++j) {
        std::memcpy(o_rows.data() + (i * rows + j) * H * D, oh.data() + (i * T + mine[size_t(j)]) * H * D,
                    size_t(H * D) * sizeof(float));
        for (int64_t h = 0; h < H; ++h)
          lse_rows[size_t((i * H + h) * rows + j)] = lh[size_t((i * H + h) * T + mine[size_t(j)])];
      }
    if (rows > 0) {
      backend.upload(o, o_rows.data(), o_rows.size() * sizeof(float));
      backend.upload(lse, lse_rows.data(), lse_rows.size() * sizeof(float));
    }
    stats.method = PrefillMethod::pass_q;
    stats.bytes_sent = d.merge.bytes_moved / uint64_t(session.size());
  }
  stats.seconds = clock.seconds();
  return stats;
}

}  // namespace ringattn::inference
