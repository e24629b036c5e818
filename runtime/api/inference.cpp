// ringattn::KVCache (include/ringattn/ringattn.hpp): the runtime's sharded cache, prefill and
// decode (runtime/inference/) behind the agreement every call of a user's starts with: each rank
// announces its call, and a problem on any rank, or shapes that differ between the ranks, throws
// the same ArgumentError on every rank before anything changes.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "ringattn/ringattn.hpp"
#include "runtime/api/arguments.hpp"
#include "runtime/inference/decode.hpp"
#include "runtime/inference/prefill.hpp"
#include "runtime/session.hpp"

namespace ringattn {

namespace {

struct CallAnnouncement {
  int32_t status = 0;  // 0 fine, 1 bad value, 2 bad type
  int32_t dtype = 0;
  int64_t a = 0, b = 0, c = 0, d = 0, e = 0, rows = 0;  // the call's shape and options
  uint64_t hash = 0;                                    // of its lists (sequences, positions)
  char argument[32] = {};
  char message[400] = {};
};

uint64_t hash_lists(const std::vector<int64_t>& x, const std::vector<int64_t>& y) {
  uint64_t h = api::fnv1a(x.data(), x.size() * sizeof(int64_t));
  const uint64_t n = x.size();
  h = api::fnv1a(&n, sizeof n, h);
  return api::fnv1a(y.data(), y.size() * sizeof(int64_t), h);
}

// Every rank's announcement; throws the first problem any rank found on every rank, then
// `what` (naming the argument) where a rank's shape or options differ from rank 0's.
std::vector<CallAnnouncement> agree(Session& session, CallAnnouncement mine, const std::optional<ArgumentError>& problem,
                                    const char* differ_argument, const char* differ_what) {
  if (problem) {
    mine.status = problem->kind() == ArgumentError::Kind::type ? 2 : 1;
    api::copy_text(mine.argument, sizeof mine.argument, problem->argument());
    api::copy_text(mine.message, sizeof mine.message, problem->message_template());
  }
  const int P = session.size();
  std::vector<CallAnnouncement> all(static_cast<size_t>(P));
  session.world().allgather(&mine, all.data(), sizeof mine);
  for (int r = 0; r < P; ++r) {
    const CallAnnouncement& x = all[size_t(r)];
    if (x.status == 0) continue;
    const std::string where = r == session.rank() ? "" : " (on rank " + std::to_string(r) + ")";
    throw ArgumentError(x.argument, std::string(x.message) + where,
                        x.status == 2 ? ArgumentError::Kind::type : ArgumentError::Kind::value);
  }
  for (int r = 1; r < P; ++r) {
    const CallAnnouncement &x = all[size_t(r)], &f = all[0];
    if (x.dtype != f.dtype || x.a != f.a || x.b != f.b || x.c != f.c || x.d != f.d || x.e != f.e || x.hash != f.hash)
    {
      std::string message = "{";
      message += differ_argument;
      message += "}: ";
      message += differ_what;
      message += " differ between rank 0 and rank " + std::to_string(r) + " (every rank makes the same call)";
      throw ArgumentError(differ_argument, message);
    }
  }
  return all;
}

std::optional<ArgumentError> check_call(const CacheOptions& o, int64_t heads, const InferenceSpec& spec,
                                        const std::vector<std::pair<const char*, const void*>>& pointers) {
  if (heads < 1 || heads % o.kv_heads != 0)
    return ArgumentError("heads", "{kv_heads} " + std::to_string(o.kv_heads) + " must divide {heads} " +
                                      std::to_string(heads));
  if (spec.window_left < -1)
    return ArgumentError("window_left", "{window_left} " + std::to_string(spec.window_left) + " must be -1 or more");
  if (spec.softmax_scale != 0.0 && !api::scale_fits_fp32(spec.softmax_scale))
    return ArgumentError("softmax_scale", "{softmax_scale} must be a finite positive fp32 number");
  for (const auto& [name, p] : pointers)
    if (!p) return ArgumentError(name, std::string("{") + name + "} is null");
  return std::nullopt;
}

float scale_of(const InferenceSpec& spec, int64_t head_dim) {
  return spec.softmax_scale != 0.0 ? float(spec.softmax_scale) : 1.0f / std::sqrt(float(head_dim));
}

}  // namespace

struct KVCache::Impl {
  Context& ctx;
  CacheOptions options;
  std::unique_ptr<inference::KVCache> cache;
};

KVCache::KVCache(Context& ctx, const CacheOptions& o) : impl_(std::make_unique<Impl>(Impl{ctx, o, nullptr})) {
  Session& session = ctx.session();
  session.backend().use_from_this_thread();
  const DType dtype = api::dtype_of(o.dtype);
  std::optional<ArgumentError> problem =
      inference::check_cache_shape({o.batch, o.kv_heads, o.head_dim, o.capacity, o.interleave, dtype});
  if (!problem) problem = session.backend().decode_problem(o.head_dim);
  CallAnnouncement mine;
  mine.dtype = int32_t(o.dtype), mine.a = o.batch, mine.b = o.kv_heads, mine.c = o.head_dim, mine.d = o.capacity,
  mine.e = o.interleave;
  agree(session, mine, problem, "options", "the cache's options");
  impl_->cache = std::make_unique<inference::KVCache>(
      session.backend(), session.rank(), session.size(),
      inference::CacheShape{o.batch, o.kv_heads, o.head_dim, o.capacity, o.interleave, dtype});
}

KVCache::~KVCache() = default;

const CacheOptions& KVCache::options() const { return impl_->options; }
std::vector<int64_t> KVCache::lengths() const { return impl_->cache->lengths(); }
int64_t KVCache::rows(int64_t sequence, int rank) const {
  if (sequence < 0 || sequence >= impl_->options.batch)
    throw ArgumentError("sequence", "{sequence} " + std::to_string(sequence) + " is out of range: the cache holds " +
                                        std::to_string(impl_->options.batch) + " sequences");
  return impl_->cache->rows(sequence, rank);
}

std::vector<int64_t> KVCache::prefill_positions(int64_t tokens, const InferenceSpec& spec) const {
  inference::PrefillRequest r;
  r.tokens = tokens, r.window_left = spec.window_left;
  const auto method = spec.method == PrefillMethod::pass_q ? inference::PrefillMethod::pass_q
                                                            : inference::PrefillMethod::pass_kv;
  return inference::prefill_chunk_positions(impl_->ctx.session(), r, method);
}

InferenceStats KVCache::prefill(int64_t heads, const InferenceSpec& spec, int64_t rows, const void* q, const void* k,
                                const void* v, float* o, float* lse, const std::optional<ArgumentError>& local_error) {
  Session& session = impl_->ctx.session();
  session.backend().use_from_this_thread();  // this call's thread may not be the last one's
  const CacheOptions& co = impl_->options;
  std::optional<ArgumentError> problem = local_error;
  if (!problem) problem = check_call(co, heads, spec, {});
  if (!problem && rows < 0) problem = ArgumentError("rows", "{rows} " + std::to_string(rows) + " must not be negative");
  if (!problem && rows > 0)
    problem = check_call(co, heads, spec, {{"q", q}, {"k", k}, {"v", v}, {"o", o}, {"lse", lse}});
  CallAnnouncement mine;
  mine.dtype = int32_t(co.dtype), mine.a = heads, mine.b = spec.window_left, mine.c = int64_t(spec.method);
  mine.d = int64_t(std::llround(spec.softmax_scale * 1e9)), mine.rows = rows;
  mine.hash = hash_lists(spec.sequences, {});
  const std::vector<CallAnnouncement> all = agree(session, mine, problem, "spec", "the prefill's heads or options");
  // The chunk's length, and every rank's rows of it as the method takes them (all ranks see all).
  int64_t tokens = 0;
  const bool pass_q = spec.method == PrefillMethod::pass_q;
  for (const CallAnnouncement& a : all) tokens = pass_q ? a.rows : tokens + a.rows;
  inference::PrefillRequest r;
  r.heads = heads, r.tokens = tokens, r.scale = scale_of(spec, co.head_dim), r.window_left = spec.window_left;
  r.threads = impl_->ctx.options().threads, r.sequences = spec.sequences;
  r.method = static_cast<inference::PrefillMethod>(spec.method);
  if (tokens < 1) throw ArgumentError("rows", "the new tokens' {rows} sum to 0 over the ranks: nothing to prefill");
  AttentionSpec causal;
  causal.mask.causal = true;
  for (int p = 0; p < session.size(); ++p) {
    const int64_t want = pass_q ? tokens : session.layout(tokens, causal).rows(p);
    if (all[size_t(p)].rows != want)
      throw ArgumentError("rows", "{rows} " + std::to_string(all[size_t(p)].rows) + " on rank " + std::to_string(p) +
                                      ", but " + (pass_q ? "pass-q takes the whole chunk of " :
                                                  "the causal layout of the chunk's ") +
                                      std::to_string(tokens) + " tokens gives it " + std::to_string(want) +
                                      (pass_q ? "" : " (take each rank's rows with prefill_positions or shard)"));
  }
  const inference::PrefillStats st = ordered_with_stream(session.backend(), impl_->ctx.cuda_stream(), [&] {
    return inference::prefill(session, *impl_->cache, r, q, k, v, o, lse);
  });
  return InferenceStats{st.seconds, static_cast<PrefillMethod>(st.method), st.bytes_sent};
}

InferenceStats KVCache::decode(int64_t heads, int64_t tokens, const InferenceSpec& spec, const void* q, const void* k,
                               const void* v, float* o, float* lse, const std::optional<ArgumentError>& local_error) {
  Session& session = impl_->ctx.session();
  session.backend().use_from_this_thread();
  const CacheOptions& co = impl_->options;
  std::optional<ArgumentError> problem = local_error;
  if (!problem) problem = check_call(co, heads, spec, {{"q", q}, {"k", k}, {"v", v}, {"o", o}, {"lse", lse}});
  if (!problem && tokens < 1)
    problem = ArgumentError("tokens", "{tokens} " + std::to_string(tokens) + " new tokens: must be at least 1");
  CallAnnouncement mine;
  mine.dtype = int32_t(co.dtype), mine.a = heads, mine.b = spec.window_left, mine.c = tokens;
  mine.d = int64_t(std::llround(spec.softmax_scale * 1e9));
  mine.hash = hash_lists(spec.sequences, spec.positions);
  agree(session, mine, problem, "q", "the new tokens' shapes or the decode's options");
  inference::DecodeRequest r;
  r.heads = heads, r.tokens = tokens, r.scale = scale_of(spec, co.head_dim), r.window_left = spec.window_left;
  r.threads = impl_->ctx.options().threads, r.sequences = spec.sequences, r.positions = spec.positions;
  const inference::DecodeStats st = ordered_with_stream(session.backend(), impl_->ctx.cuda_stream(), [&] {
    return inference::decode_step(session, *impl_->cache, r, q, k, v, o, lse);
  });
  return InferenceStats{st.seconds, PrefillMethod::automatic, st.merge.bytes_moved / uint64_t(session.size())};
}

}  // namespace ringattn
