// ringattn::Context (include/ringattn/ringattn.hpp): a runtime session (runtime/session.hpp) and
// the agreement every call of a user's starts with, since a user's ranks may pass anything.
#include <algorithm>
#include <cstring>

#include "ringattn/ringattn.hpp"
#include "runtime/api/arguments.hpp"
#include "runtime/session.hpp"

namespace ringattn {

namespace {

// What every rank says about a call before any data moves: its shard, a hash of its spec, and
// the first problem it found (status 0 when none). The problem travels as its message template,
// so that every rank throws the same ArgumentError for its interface to name in its own words.
struct Announcement {
  int32_t status = 0;  // 0 fine, 1 bad value, 2 bad type
  int32_t dtype = 0;
  int64_t batch = 0, rows = 0, heads = 0, kv_heads = 0, head_dim = 0;
  uint64_t spec_hash = 0;
  char argument[32] = {};
  char message[400] = {};
};

std::string shape_text(const Announcement& a, bool keys) {
  return "(" + std::to_string(a.batch) + ", L_local, " + std::to_string(keys ? a.kv_heads : a.heads) + ", " +
         std::to_string(a.head_dim) + ")";
}

}  // namespace

struct Context::Impl {
  Session session;
  std::function<void(int, int)> on_step;
  std::optional<void*> caller_stream;  // set once set_cuda_stream is called (nullptr is a stream too)

  Impl(MPI_Comm comm, const ContextOptions& options) : session(comm, SessionOptions{options, {}}) {}

  // Agrees on the call (collective); returns its plan, or throws ArgumentError on every rank.
  AttentionPlan& agree(const Shard& shard, const AttentionSpec& spec, const std::optional<ArgumentError>& local_error);
  // Runs one pass of `plan` (pass: the plan's attention), ordered with the caller's stream.
  template <class Pass>
  RingStats run(AttentionPlan& plan, Pass pass);
};

Context::Context(MPI_Comm comm, const ContextOptions& options) : impl_(std::make_unique<Impl>(comm, options)) {}

Context::~Context() = default;

Session& Context::session() { return impl_->session; }
std::optional<void*> Context::cuda_stream() const {
  return impl_->caller_stream;
}

int Context::rank() const { return impl_->session.rank(); }
int Context::size() const { return impl_->session.size(); }
int Context::nodes() const { return impl_->session.nodes().nodes(); }
const ContextOptions& Context::options() const { return impl_->session.options(); }
size_t Context::cached_plans() const { return impl_->session.cached_plans(); }
void Context::set_step_callback(std::function<void(int, int)> on_step) { impl_->on_step = std::move(on_step); }
void Context::set_cuda_stream(void* stream) {
  impl_->caller_stream = stream;
}

SequenceLayout Context::layout(const AttentionSpec& spec) const {
  switch (api::layout_kind(spec)) {
    case LayoutKind::zigzag: return SequenceLayout::zigzag;
    case LayoutKind::striped: return SequenceLayout::striped;
    default: return SequenceLayout::contiguous;
  }
}

int64_t Context::rows(int64_t seq_len, const AttentionSpec& spec, int rank) const {
  return impl_->session.layout(seq_len, spec).rows(rank < 0 ? this->rank() : rank);
}

std::vector<int64_t> Context::positions(int64_t seq_len, const AttentionSpec& spec, int rank) const {
  return impl_->session.layout(seq_len, spec).positions(rank < 0 ? this->rank() : rank);
}

void Context::allgather_bytes(const void* send, size_t bytes, void* recv, const std::vector<size_t>& bytes_per_rank) {
  if (bytes_per_rank.size() != static_cast<size_t>(size()) || bytes_per_rank[static_cast<size_t>(rank())] != bytes)
    throw ArgumentError("bytes_per_rank", "{bytes_per_rank}: one count per rank, this rank's equal to {bytes}");
  impl_->session.world().allgatherv(send, recv, bytes_per_rank);
}

AttentionPlan& Context::Impl::agree(const Shard& shard, const AttentionSpec& spec,
                                    const std::optional<ArgumentError>& local_error) {
  comm::Communicator& world = session.world();
  const int P = world.size();
  std::optional<ArgumentError> problem = local_error;
  if (!problem && shard.rows < 1)
    problem = ArgumentError("rows", "{rows} " + std::to_string(shard.rows) + " (this rank's rows) must be positive");
  if (!problem) problem = api::check_shard(shard, session.options().backend == "cuda");
  if (!problem) problem = api::check_spec(spec);
  Announcement mine;
  if (problem) {
    mine.status = problem->kind() == ArgumentError::Kind::type ? 2 : 1;
    api::copy_text(mine.argument, sizeof mine.argument, problem->argument());
    api::copy_text(mine.message, sizeof mine.message, problem->message_template());
  } else {
    mine.dtype = static_cast<int32_t>(shard.dtype);
    mine.batch = shard.batch, mine.rows = shard.rows, mine.heads = shard.heads, mine.kv_heads = shard.kv_heads,
    mine.head_dim = shard.head_dim;
    Shard shape = shard;
    shape.rows = 0;
    const std::string key = api::plan_key(shape, spec, 0);
    mine.spec_hash = api::fnv1a(key.data(), key.size());
  }
  std::vector<Announcement> all(static_cast<size_t>(P));
  world.allgather(&mine, all.data(), sizeof mine);  // bounded by the timeout: a dead peer is a CommError

  for (int r = 0; r < P; ++r) {
    const Announcement& a = all[static_cast<size_t>(r)];
    if (a.status == 0) continue;
    const std::string where = r == world.rank() ? "" : " (on rank " + std::to_string(r) + ")";
    throw ArgumentError(a.argument, std::string(a.message) + where,
                        a.status == 2 ? ArgumentError::Kind::type : ArgumentError::Kind::value);
  }
  const Announcement& first = all[0];
  int64_t L = 0;
  for (int r = 0; r < P; ++r) {
    const Announcement& a = all[static_cast<size_t>(r)];
    const std::string on = " on rank " + std::to_string(r) + " but ";
    if (a.dtype != first.dtype)
      throw ArgumentError("dtype", "{dtype} differs between ranks (rank 0 and rank " + std::to_string(r) + ")",
                          ArgumentError::Kind::type);
    if (a.batch != first.batch || a.heads != first.heads || a.head_dim != first.head_dim)
      throw ArgumentError("q", "{q} has shape " + shape_text(a, false) + on + shape_text(first, false) +
                                   " on rank 0 (every rank passes its rows of the same tensor)");
    if (a.kv_heads != first.kv_heads)
      throw ArgumentError("k", "{k} has shape " + shape_text(a, true) + on + shape_text(first, true) + " on rank 0");
    if (a.spec_hash != first.spec_hash)
      throw ArgumentError("spec", "{spec} differ between rank 0 and rank " + std::to_string(r) +
                                      " (every rank must pass the same mask, layout, schedule, scale and ulysses)");
    L += a.rows;
  }
  // The same data on every rank from here: every rank finds the same problem, or none.
  if (auto late = api::check_call(shard, spec, L, P)) throw *late;
  const ShardLayout layout = session.layout(L, spec);  // the same placement as the plan's
  for (int r = 0; r < P; ++r)
    if (layout.rows(r) != all[static_cast<size_t>(r)].rows)
      throw ArgumentError("rows", "{rows} " + std::to_string(all[static_cast<size_t>(r)].rows) + " on rank " +
                                      std::to_string(r) + ", but the " + layout_name(layout.kind()) + " layout of " +
                                      std::to_string(L) + " positions over " + std::to_string(P) + " ranks gives it " +
                                      std::to_string(layout.rows(r)) + " (take each rank's rows with shard())");
  return session.plan(shard, spec, L);
}

void Context::check(const Shard& shard, const AttentionSpec& spec, const std::optional<ArgumentError>& local_error) {
  impl_->session.backend().use_from_this_thread();
  impl_->agree(shard, spec, local_error);
}

template <class Pass>
RingStats Context::Impl::run(AttentionPlan& plan, Pass pass) {
  UlyssesAttention& attention = plan.attention();
  attention.on_step = on_step;
  AttentionBackend& backend = session.backend();
  const PassStats s = ordered_with_stream(backend, caller_stream, [&] { return pass(attention); });
  return ring_stats(s, attention);
}

namespace {

// The first null pointer of a call, as the argument at fault.
std::optional<ArgumentError> null_pointer(std::initializer_list<std::pair<const char*, const void*>> pointers) {
  for (const auto& [name, p] : pointers)
    if (!p) return ArgumentError(name, "{" + std::string(name) + "} is a null pointer");
  return std::nullopt;
}

}  // namespace

RingStats Context::forward(const Shard& shard, const AttentionSpec& spec, const void* q, const void* k, const void* v,
                           float* o, float* lse, ForwardHandle* saved) {
  impl_->session.backend().use_from_this_thread();  // this call's thread may not be the last one's
  AttentionPlan& plan =
      impl_->agree(shard, spec, null_pointer({{"q", q}, {"k", k}, {"v", v}, {"o", o}, {"lse", lse}}));
  const RingStats stats = impl_->run(plan, [&](UlyssesAttention& a) { return a.forward(q, k, v, o, lse); });
  if (saved) *saved = ForwardHandle{plan.id(), plan.attention().last_forward()};
  return stats;
}

RingStats Context::backward(const Shard& shard, const AttentionSpec& spec, const void* q, const void* k, const void* v,
                            const float* o, const float* lse, const void* dout, float* dq, float* dk, float* dv,
                            const ForwardHandle* saved) {
  impl_->session.backend().use_from_this_thread();
  AttentionPlan& plan = impl_->agree(shard, spec,
                                     null_pointer({{"q", q}, {"k", k}, {"v", v}, {"o", o}, {"lse", lse}, {"dout", dout},
                                                   {"dq", dq}, {"dk", dk}, {"dv", dv}}));
  const uint64_t pass = saved && saved->plan == plan.id() ? saved->pass : 0;
  return impl_->run(plan, [&](UlyssesAttention& a) { return a.backward(q, k, v, o, lse, dout, dq, dk, dv, pass); });
}

}  // namespace ringattn
