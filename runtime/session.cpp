#include "runtime/session.hpp"

#include <algorithm>
#include <thread>

#include "comm/emulated_link_communicator.hpp"
#include "runtime/api/arguments.hpp"
#include "runtime/cuda_backend.hpp"
#if defined(RINGATTN_WITH_NCCL)
#include "comm/host_staged_communicator.hpp"
#include "comm/nccl_communicator.hpp"
#endif

namespace ringattn {

namespace {

comm::LinkEmulation inter_link(const ContextOptions& o) {
  return {o.emulate_bandwidth_gbps, o.emulate_latency_us};
}
comm::LinkEmulation intra_link(const ContextOptions& o) {
  return {o.emulate_intra_bandwidth_gbps, o.emulate_intra_latency_us};
}

}  // namespace

RingStats ring_stats(const PassStats& s, const UlyssesAttention& attention) {
  RingStats stats;
  stats.cudnn_steps = s.cudnn_steps;
  stats.own_steps = s.own_steps;
  stats.seconds = s.seconds;
  stats.wait_seconds = s.wait_seconds;
  stats.compute_seconds = s.compute_seconds;
  stats.bytes_sent = s.bytes_sent;
  stats.bytes_needed = attention.bytes_needed();
  stats.a2a_bytes_sent = attention.a2a_bytes_sent();
  return stats;
}

Session::Session(MPI_Comm comm, const SessionOptions& options) : options_(options) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) throw Fault("ringattn: MPI is not initialised (call MPI_Init_thread first)");
  if (comm == MPI_COMM_NULL) throw ArgumentError("comm", "{comm} is MPI_COMM_NULL");
  const ContextOptions& o = options_.context;
  world_ = std::make_unique<comm::MpiCommunicator>(comm);
  if (o.timeout_s > 0) world_->set_timeout(o.timeout_s);
  // Every rank checks its options before NCCL or a GPU is touched; one rank's bad option fails
  // every rank.
  std::optional<ArgumentError> bad = api::check_options(o);
  if (!bad && !options_.pretend_nodes.empty() && options_.pretend_nodes.size() != size_t(world_->size()))
    bad = ArgumentError("pretend_nodes", "{pretend_nodes}: " + std::to_string(options_.pretend_nodes.size()) +
                                             " node ids for " + std::to_string(world_->size()) + " ranks");
  int failed = bad ? 1 : 0;
  world_->allreduce(&failed, 1, DType::i32, comm::ReduceOp::max);
  if (bad) throw *bad;
  if (failed) throw ArgumentError("options", "another rank's {options} were refused");

  nodes_ = find_nodes(*world_);  // one discovery, a bounded collective
  placement_nodes_ = options_.pretend_nodes.empty() ? nodes_.node_of_rank : options_.pretend_nodes;
  const int local_rank = nodes_.local_rank(rank()), local_ranks = nodes_.local_ranks(rank());

  comm::Communicator* host = world_.get();
  if (inter_link(o).active()) {
    emulated_ = std::make_unique<comm::EmulatedLinkCommunicator>(*world_, inter_link(o));
    host = emulated_.get();
  }
  transport_ = host;
  if (o.backend == "cpu") {
    const int threads =
        o.threads > 0 ? o.threads : std::max(1, static_cast<int>(std::thread::hardware_concurrency()) / local_ranks);
    backend_ = make_cpu_backend(threads);
  } else {
    int device = o.device >= 0 ? o.device : local_rank % std::max(1, cuda_device_count());
#if defined(RINGATTN_WITH_NCCL)
    if (o.comm == "nccl") {
      auto nccl = std::make_unique<comm::NcclCommunicator>(world_->mpi_comm(), o.timeout_s);
      device = nccl->device();
      device_ = std::move(nccl);
    } else {  // ranks may share a GPU: device buffers go over MPI through host memory
      device_ = std::make_unique<comm::HostStagedCommunicator>(*host);
    }
    transport_ = device_.get();
#endif
    backend_ = make_cuda_backend(device);
#if defined(RINGATTN_WITH_NCCL)
    // NCCL's steps run on their own stream, ordered after the backend's kernels by events.
    if (auto* nccl = dynamic_cast<comm::NcclCommunicator*>(device_.get())) nccl->order_after(backend_->native_stream());
#endif
  }
  transport_->set_timeout(o.timeout_s);
}

Session::~Session() {
  plans_.clear();  // the rings refer to the backend and the communicators
  groups_.clear();
  backend_.reset();
  device_.reset();
  emulated_.reset();
}

ShardLayout Session::layout(int64_t seq_len, const AttentionSpec& spec) const {
  if (spec.ulysses < 1 || size() % spec.ulysses != 0)
    throw ArgumentError("ulysses", "{ulysses} " + std::to_string(spec.ulysses) + " must divide the " +
                                       std::to_string(size()) + " ranks");
  std::vector<int> members;
  if (spec.ulysses > 1) members = place_ulysses_groups(placement_nodes_, spec.ulysses).members;
  return ShardLayout(api::layout_kind(spec), seq_len, size(), spec.ulysses, std::move(members));
}

std::unique_ptr<comm::Communicator> Session::split_group(int color, int key) {
#if defined(RINGATTN_WITH_NCCL)
  if (auto* nccl = dynamic_cast<comm::NcclCommunicator*>(device_.get())) return nccl->split(color, key);
#endif
  std::unique_ptr<comm::Communicator> part = world_->split(color, key);
  if (intra_link(options()).active())
    part = std::make_unique<comm::EmulatedLinkCommunicator>(std::move(part), intra_link(options()));
#if defined(RINGATTN_WITH_NCCL)
  if (device_) part = std::make_unique<comm::HostStagedCommunicator>(std::move(part));
#endif
  part->set_timeout(options().timeout_s);
  return part;
}

AttentionPlan& Session::plan(const Shard& shard, const AttentionSpec& spec, int64_t seq_len) {
  const std::string key = api::plan_key(shard, spec, seq_len);
  auto it = plans_.find(key);
  if (it != plans_.end() && it->second->block_mask_ == spec.mask.block_mask) return *it->second;
  const bool cuda = options().backend == "cuda";
  if (auto bad = api::check_shard(shard, cuda)) throw *bad;
  if (auto bad = api::check_spec(spec)) throw *bad;
  if (auto bad = api::check_call(shard, spec, seq_len, size())) throw *bad;
  const RingOptions ring = api::ring_options(shard, spec);
  if (auto bad = backend_->kernel_problem(ring.kernel, ring.dims, ring.dtype)) throw *bad;

  auto plan = std::make_unique<AttentionPlan>(next_plan_id_++, api::build_mask(spec, seq_len), spec.mask.block_mask);
  std::shared_ptr<UlyssesGroups>& groups = groups_[spec.ulysses];
  if (!groups)  // collective (the split)
    groups = std::make_shared<UlyssesGroups>(make_ulysses_groups(
        rank(), size(), spec.ulysses > 1 ? place_ulysses_groups(placement_nodes_, spec.ulysses) : UlyssesPlacement{},
        spec.ulysses, [this](int color, int key) { return split_group(color, key); }));
  plan->attention_ = std::make_unique<UlyssesAttention>(*transport_, *backend_, api::layout_kind(spec), seq_len,
                                                         plan->mask_, ring, groups);
  AttentionPlan& p = *plan;
  plans_[key] = std::move(plan);
  return p;
}

}  // namespace ringattn
