// ringattn::Context (include/ringattn/ringattn.hpp): the communicator and backend of a caller's
// ranks, the agreement every call starts with, and the plans cached per call shape.
#include <algorithm>
#include <cstring>
#include <map>
#include <thread>

#include "comm/mpi_communicator.hpp"
#include "ringattn/ringattn.hpp"
#include "runtime/api/arguments.hpp"
#include "runtime/backend.hpp"
#include "runtime/cuda_backend.hpp"
#include "runtime/ulysses_attention.hpp"
#if defined(RINGATTN_WITH_NCCL)
#include "comm/host_staged_communicator.hpp"
#include "comm/nccl_communicator.hpp"
#endif

namespace ringattn {

namespace {

// What every rank says about a call before any data moves: its shard, a hash of its spec, and
// the first problem it found (empty message when none).
struct Announcement {
  int32_t status = 0;  // 0 fine, 1 bad value, 2 bad type
  int32_t dtype = 0;
  int64_t batch = 0, rows = 0, heads = 0, kv_heads = 0, head_dim = 0;
  uint64_t spec_hash = 0;
  char argument[32] = {};
  char message[400] = {};
};

void copy_text(char* dst, size_t capacity, const std::string& s) {
  const size_t n = std::min(capacity - 1, s.size());
  std::memcpy(dst, s.data(), n);
  dst[n] = '\0';
}

std::string shape_text(const Announcement& a, bool keys) {
  return "(" + std::to_string(a.batch) + ", L_local, " + std::to_string(keys ? a.kv_heads : a.heads) + ", " +
         std::to_string(a.head_dim) + ")";
}

}  // namespace

// A cached plan: what the attention refers to (the mask) lives here with it.
struct Plan {
  Mask mask;
  std::vector<uint8_t> block_mask;  // as given, to tell a hash collision from a hit
  std::unique_ptr<UlyssesAttention> ring;  // the plain ring when ulysses == 1
  explicit Plan(Mask m) : mask(std::move(m)) {}
};

struct Context::Impl {
  ContextOptions options;
  std::unique_ptr<comm::MpiCommunicator> mpi;
  std::unique_ptr<comm::Communicator> owned_ring_comm;  // NCCL or host-staged with CUDA
  comm::Communicator* ring_comm = nullptr;
  std::unique_ptr<AttentionBackend> backend;
  std::function<void(int, int)> on_step;
  bool has_caller_stream = false;  // set_cuda_stream was called
  void* caller_stream = nullptr;
  std::map<std::string, std::unique_ptr<Plan>> plans;
  int local_rank = 0, local_ranks = 1;
  std::vector<int> nodes;  // the node of every rank (find_nodes): where the --ulysses groups go
  // The groups of each AttentionSpec::ulysses in use, shared by the plans: one group
  // communicator per degree, however many plans.
  std::map<int, std::shared_ptr<UlyssesGroups>> groups;

  // The layout of a sequence of seq_len positions for this spec, over these ranks and nodes;
  // throws ArgumentError for an AttentionSpec::ulysses that does not divide the ranks.
  ShardLayout layout(int64_t seq_len, const AttentionSpec& spec) const;

  // Agrees on the call (collective); returns the plan, or throws ArgumentError on every rank.
  Plan& agree(const Shard& shard, const AttentionSpec& spec, const ArgumentError* local_error);
  // Runs one pass of `plan` (pass: the ring's PassStats), ordered with the caller's stream.
  template <class Pass>
  RingStats run(Plan& plan, Pass pass);
};

namespace {

// This rank's index among the ranks of its node, and their number.
void count_node_ranks(const std::vector<int>& node_of_rank, int rank, int& local_rank, int& local_ranks) {
  local_rank = 0, local_ranks = 0;
  for (int r = 0; r < static_cast<int>(node_of_rank.size()); ++r)
    if (node_of_rank[size_t(r)] == node_of_rank[size_t(rank)]) {
      if (r < rank) ++local_rank;
      ++local_ranks;
    }
}

ArgumentError check_options(const ContextOptions& o) {
  if (o.backend != "cpu" && o.backend != "cuda")
    return ArgumentError("options.backend", "options.backend: '" + o.backend + "', expected cpu or cuda");
  if (o.comm != "mpi" && o.comm != "nccl")
    return ArgumentError("options.comm", "options.comm: '" + o.comm + "', expected mpi or nccl");
  if (o.comm == "nccl" && o.backend != "cuda")
    return ArgumentError("options.comm", "options.comm: nccl needs the cuda backend (NCCL moves device memory)");
#if !defined(RINGATTN_WITH_CUDA)
  if (o.backend == "cuda")
    return ArgumentError("options.backend", "options.backend: this build has no CUDA backend");
#else
  if (o.backend == "cuda" && !cuda_device_available())
    return ArgumentError("options.backend", "options.backend: cuda, but no GPU is visible on this node");
#endif
  if (o.threads < 0) return ArgumentError("options.threads", "options.threads: must be >= 0 (0: automatic)");
  if (!(o.timeout_s > 0)) return ArgumentError("options.timeout_s", "options.timeout_s: must be positive");
  if (o.emulate_bandwidth_gbps < 0 || o.emulate_latency_us < 0 || o.emulate_intra_bandwidth_gbps < 0 ||
      o.emulate_intra_latency_us < 0)
    return ArgumentError("options.emulate_bandwidth_gbps", "options.emulate_*: must not be negative");
  return ArgumentError("", "");
}

}  // namespace

Context::Context(MPI_Comm comm, const ContextOptions& options) : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  m.options = options;
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) throw std::runtime_error("ringattn::Context: MPI is not initialised (call MPI_Init_thread first)");
  if (comm == MPI_COMM_NULL) throw ArgumentError("comm", "comm: MPI_COMM_NULL");
  m.mpi = std::make_unique<comm::MpiCommunicator>(comm);
  if (options.timeout_s > 0) m.mpi->set_timeout(options.timeout_s);
  // The options are checked on every rank before NCCL or a GPU is touched; one rank's bad
  // option fails every rank.
  const ArgumentError bad = check_options(options);
  int failed = bad.argument().empty() ? 0 : 1;
  m.mpi->allreduce(&failed, 1, DType::i32, comm::ReduceOp::max);
  if (failed) {
    if (!bad.argument().empty()) throw bad;
    throw ArgumentError("options", "options: another rank's options were refused");
  }
  // One discovery of the nodes (a bounded collective, as find_nodes): the real ones choose this
  // rank's GPU, a test's pretend ones, if any, place the --ulysses groups.
  const std::vector<int> nodes = m.mpi->node_of_ranks();
  count_node_ranks(nodes, m.mpi->rank(), m.local_rank, m.local_ranks);
  m.nodes = pretend_nodes(m.mpi->size()).value_or(nodes);
  m.ring_comm = m.mpi.get();
  if (options.backend == "cpu") {
    const int threads = options.threads > 0
                            ? options.threads
                            : std::max(1, static_cast<int>(std::thread::hardware_concurrency()) / m.local_ranks);
    m.backend = make_cpu_backend(threads);
  } else {
    int device = options.device >= 0 ? options.device : m.local_rank % std::max(1, cuda_device_count());
#if defined(RINGATTN_WITH_NCCL)
    if (options.comm == "nccl") {
      auto nccl = std::make_unique<comm::NcclCommunicator>(m.mpi->mpi_comm(), options.timeout_s);
      device = nccl->device();
      m.owned_ring_comm = std::move(nccl);
    } else {  // ranks may share a GPU: device buffers go over MPI through host memory
      m.owned_ring_comm = std::make_unique<comm::HostStagedCommunicator>(*m.mpi);
    }
    m.ring_comm = m.owned_ring_comm.get();
#endif
    m.backend = make_cuda_backend(device);
#if defined(RINGATTN_WITH_NCCL)
    // NCCL's steps run on their own stream, ordered after the backend's kernels by events.
    if (auto* nccl = dynamic_cast<comm::NcclCommunicator*>(m.owned_ring_comm.get()))
      nccl->order_after(m.backend->native_stream());
#endif
  }
  m.ring_comm->set_timeout(options.timeout_s);
  m.ring_comm->set_link_emulation(comm::LinkEmulation{options.emulate_bandwidth_gbps, options.emulate_latency_us});
}

Context::~Context() {
  if (!impl_) return;
  impl_->plans.clear();  // the rings refer to the backend and communicators
  impl_->groups.clear();
  impl_->backend.reset();
  impl_->owned_ring_comm.reset();
}

int Context::rank() const { return impl_->mpi->rank(); }
int Context::size() const { return impl_->mpi->size(); }
const ContextOptions& Context::options() const { return impl_->options; }
AttentionBackend& Context::backend() { return *impl_->backend; }
comm::Communicator& Context::communicator() { return *impl_->ring_comm; }
size_t Context::cached_plans() const { return impl_->plans.size(); }
void Context::set_step_callback(std::function<void(int, int)> on_step) { impl_->on_step = std::move(on_step); }
void Context::set_cuda_stream(void* stream) {
  impl_->has_caller_stream = true;
  impl_->caller_stream = stream;
}

SequenceLayout Context::layout(const AttentionSpec& spec) const {
  switch (api::layout_kind(spec)) {
    case LayoutKind::zigzag: return SequenceLayout::zigzag;
    case LayoutKind::striped: return SequenceLayout::striped;
    default: return SequenceLayout::contiguous;
  }
}

ShardLayout Context::Impl::layout(int64_t seq_len, const AttentionSpec& spec) const {
  const int P = mpi->size();
  if (seq_len < P)
    throw ArgumentError("seq_len", "seq_len: " + std::to_string(seq_len) + " positions cannot be sharded over " +
                                       std::to_string(P) + " ranks (each needs at least one)");
  if (spec.ulysses < 1 || P % spec.ulysses != 0)
    throw ArgumentError("ulysses", "ulysses: " + std::to_string(spec.ulysses) + " must divide the " +
                                       std::to_string(P) + " ranks");
  std::vector<int> members;
  if (spec.ulysses > 1) members = place_ulysses_groups(nodes, spec.ulysses).members;
  return ShardLayout(api::layout_kind(spec), seq_len, P, spec.ulysses, std::move(members));
}

int64_t Context::rows(int64_t seq_len, const AttentionSpec& spec, int rank) const {
  return impl_->layout(seq_len, spec).rows(rank < 0 ? this->rank() : rank);
}

std::vector<int64_t> Context::positions(int64_t seq_len, const AttentionSpec& spec, int rank) const {
  return impl_->layout(seq_len, spec).positions(rank < 0 ? this->rank() : rank);
}

void Context::allgather_bytes(const void* send, size_t bytes, void* recv, const std::vector<size_t>& bytes_per_rank) {
  if (bytes_per_rank.size() != static_cast<size_t>(size()) || bytes_per_rank[static_cast<size_t>(rank())] != bytes)
    throw ArgumentError("bytes_per_rank", "bytes_per_rank: one count per rank, this rank's equal to bytes");
  impl_->mpi->allgatherv(send, recv, bytes_per_rank);
}

Plan& Context::Impl::agree(const Shard& shard, const AttentionSpec& spec, const ArgumentError* local_error) {
  const int P = mpi->size();
  ArgumentError problem = local_error ? *local_error : api::check_local(shard, spec, options.backend == "cuda");
  Announcement mine;
  if (!problem.argument().empty()) {
    mine.status = problem.kind() == ArgumentError::Kind::type ? 2 : 1;
    copy_text(mine.argument, sizeof mine.argument, problem.argument());
    copy_text(mine.message, sizeof mine.message, problem.what());
  } else {
    mine.dtype = static_cast<int32_t>(shard.dtype);
    mine.batch = shard.batch, mine.rows = shard.rows, mine.heads = shard.heads, mine.kv_heads = shard.kv_heads,
    mine.head_dim = shard.head_dim;
    const std::string key = api::plan_key(Shard{shard.batch, 0, shard.heads, shard.kv_heads, shard.head_dim,
                                                shard.dtype},
                                          spec, 0);
    mine.spec_hash = api::fnv1a(key.data(), key.size());
  }
  std::vector<Announcement> all(static_cast<size_t>(P));
  mpi->allgather(&mine, all.data(), sizeof mine);  // bounded by the timeout: a dead peer is a CommError

  for (int r = 0; r < P; ++r) {
    const Announcement& a = all[static_cast<size_t>(r)];
    if (a.status == 0) continue;
    const std::string where = r == mpi->rank() ? "" : " (on rank " + std::to_string(r) + ")";
    throw ArgumentError(a.argument, std::string(a.message) + where,
                        a.status == 2 ? ArgumentError::Kind::type : ArgumentError::Kind::value);
  }
  const Announcement& first = all[0];
  int64_t L = 0;
  for (int r = 0; r < P; ++r) {
    const Announcement& a = all[static_cast<size_t>(r)];
    const std::string on = " on rank " + std::to_string(r) + " but ";
    if (a.dtype != first.dtype)
      throw ArgumentError("q", "q: the element type differs between ranks (rank 0 and rank " + std::to_string(r) + ")",
                          ArgumentError::Kind::type);
    if (a.batch != first.batch || a.heads != first.heads || a.head_dim != first.head_dim)
      throw ArgumentError("q", "q: shape " + shape_text(a, false) + on + shape_text(first, false) +
                                   " on rank 0 (every rank passes its rows of the same tensor)");
    if (a.kv_heads != first.kv_heads)
      throw ArgumentError("k", "k: shape " + shape_text(a, true) + on + shape_text(first, true) + " on rank 0");
    if (a.spec_hash != first.spec_hash)
      throw ArgumentError("mask", "mask: the mask, layout, schedule, softmax_scale or ulysses differ between rank 0 "
                                  "and rank " + std::to_string(r) + " (every rank must pass the same)");
    L += a.rows;
  }
  // The same data on every rank from here: every rank finds the same problem, or none.
  const ArgumentError late = api::check_with_length(spec, L);
  if (!late.argument().empty()) throw late;
  const LayoutKind kind = api::layout_kind(spec);
  if (L < P)
    throw ArgumentError("q", "q: a sequence of " + std::to_string(L) + " rows cannot be sharded over " +
                                 std::to_string(P) + " ranks");
  if (spec.ulysses < 1 || P % spec.ulysses != 0 || first.heads % spec.ulysses != 0 ||
      (first.kv_heads % spec.ulysses != 0 && spec.ulysses % first.kv_heads != 0))
    throw ArgumentError("ulysses", "ulysses: " + std::to_string(spec.ulysses) + " must divide the " +
                                       std::to_string(P) + " ranks and the " + std::to_string(first.heads) +
                                       " heads, and divide or be a multiple of the " +
                                       std::to_string(first.kv_heads) + " K/V heads");
  const ShardLayout layout = this->layout(L, spec);  // the same placement as the UlyssesAttention's
  for (int r = 0; r < P; ++r)
    if (layout.rows(r) != all[static_cast<size_t>(r)].rows)
      throw ArgumentError("q", "q: rank " + std::to_string(r) + " holds " +
                                   std::to_string(all[static_cast<size_t>(r)].rows) + " rows, but the " +
                                   layout_name(kind) + " layout of " + std::to_string(L) + " positions over " +
                                   std::to_string(P) + " ranks gives it " + std::to_string(layout.rows(r)) +
                                   " (take each rank's rows with shard())");

  const std::string key = api::plan_key(shard, spec, L);
  auto it = plans.find(key);
  if (it != plans.end() && it->second->block_mask == spec.mask.block_mask) return *it->second;
  auto plan = std::make_unique<Plan>(api::build_mask(spec, L));
  plan->block_mask = spec.mask.block_mask;
  std::shared_ptr<UlyssesGroups>& g = groups[spec.ulysses];
  if (!g) g = std::make_shared<UlyssesGroups>(make_ulysses_groups(*ring_comm, spec.ulysses));  // collective
  plan->ring = std::make_unique<UlyssesAttention>(*ring_comm, *backend, kind, L, plan->mask,
                                                  api::ring_options(shard, spec), g);
  if (comm::Communicator* group = plan->ring->group_comm())
    group->set_link_emulation(comm::LinkEmulation{options.emulate_intra_bandwidth_gbps, options.emulate_intra_latency_us});
  Plan& p = *plan;
  plans[key] = std::move(plan);
  return p;
}

void Context::check(const Shard& shard, const AttentionSpec& spec, const ArgumentError* local_error) {
  impl_->backend->use_from_this_thread();
  impl_->agree(shard, spec, local_error);
}

namespace {

RingStats public_stats(const PassStats& s, const UlyssesAttention& ring);

}  // namespace

template <class Pass>
RingStats Context::Impl::run(Plan& plan, Pass pass) {
  plan.ring->on_step = on_step;
  if (has_caller_stream) backend->after_stream(caller_stream);
  const PassStats stats = pass(*plan.ring);
  if (has_caller_stream) backend->before_stream(caller_stream);
  return public_stats(stats, *plan.ring);
}

RingStats Context::forward(const Shard& shard, const AttentionSpec& spec, const void* q, const void* k, const void* v,
                           float* o, float* lse) {
  const char* missing = !q ? "q" : !k ? "k" : !v ? "v" : !o ? "o" : !lse ? "lse" : nullptr;
  const ArgumentError null_pointer(missing ? missing : "", std::string(missing ? missing : "") + ": null pointer");
  impl_->backend->use_from_this_thread();  // this call's thread may not be the last one's
  Plan& plan = impl_->agree(shard, spec, missing ? &null_pointer : nullptr);
  return impl_->run(plan, [&](UlyssesAttention& ring) { return ring.forward(q, k, v, o, lse); });
}

RingStats Context::backward(const Shard& shard, const AttentionSpec& spec, const void* q, const void* k, const void* v,
                            const float* o, const float* lse, const void* dout, float* dq, float* dk, float* dv) {
  const char* missing = !q      ? "q"
                        : !k    ? "k"
                        : !v    ? "v"
                        : !o    ? "o"
                        : !lse  ? "lse"
                        : !dout ? "dout"
                                : nullptr;
  const ArgumentError null_pointer(missing ? missing : "", std::string(missing ? missing : "") + ": null pointer");
  impl_->backend->use_from_this_thread();  // this call's thread may not be the last one's
  Plan& plan = impl_->agree(shard, spec, missing ? &null_pointer : nullptr);
  return impl_->run(plan, [&](UlyssesAttention& ring) { return ring.backward(q, k, v, o, lse, dout, dq, dk, dv); });
}

namespace {

RingStats public_stats(const PassStats& s, const UlyssesAttention& ring) {
  RingStats p;
  p.seconds = s.seconds;
  p.wait_seconds = s.wait_seconds;
  p.compute_seconds = s.compute_seconds;
  p.bytes_sent = s.bytes_sent;
  p.bytes_needed = ring.bytes_needed();
  p.a2a_bytes_sent = ring.a2a_bytes_sent();
  return p;
}

}  // namespace

}  // namespace ringattn
