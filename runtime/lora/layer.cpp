#include "runtime/lora/layer.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>

#include "util/stopwatch.hpp"
#include "kernels/cpu/attention_cpu.hpp"
#include "runtime/api/arguments.hpp"
#include "runtime/session.hpp"
#include "runtime/errors.hpp"

namespace ringattn {

namespace {

const LayerConfig& validated(const LayerConfig& c, const AttentionBackend& backend) {
  c.validate(backend.memory() == comm::MemorySpace::host);
  return c;
}

size_t floats(int64_t n) { return sizeof(float) * static_cast<size_t>(n); }

}  // namespace

const char* projection_name(int p) {
  static const char* names[kProjections] = {"q", "k", "v", "o"};
  return p >= 0 && p < kProjections ? names[p] : "?";
}

ProjectionShape LayerConfig::shape(int p) const {
  const int64_t D = head_dim();
  const int64_t r = lora[static_cast<size_t>(p)] ? lora_rank : 0;
  const bool b = bias[static_cast<size_t>(p)];
  switch (p) {
    case kQuery: return {heads * D, d_model, r, b};
    case kKey:
    case kValue: return {kv_heads * D, d_model, r, b};
    default: return {d_model, heads * D, r, b};
  }
}

void LayerConfig::validate(bool cpu_kernels) const {
  auto n = [](int64_t v) { return std::to_string(v); };
  for (auto [name, value] : {std::pair<const char*, int64_t>{"batch", batch}, {"seq_len", seq_len},
                             {"d_model", d_model}, {"heads", heads}, {"kv_heads", kv_heads}})
    if (value < 1) throw ArgumentError(name, "{" + std::string(name) + "} " + n(value) + " must be positive");
  if (d_model % heads != 0)
    throw ArgumentError("heads", "{heads} " + n(heads) + " does not divide {d_model} " + n(d_model) +
                                     " (the head dim is d_model / heads)");
  if (heads % kv_heads != 0)
    throw ArgumentError("kv_heads", "{kv_heads} " + n(kv_heads) + " must divide {heads} " + n(heads) +
                                        " (grouped-query attention)");
  if (cpu_kernels && !kernels::cpu_supports_head_dim(head_dim()))
    throw ArgumentError("heads", "{heads} " + n(heads) + " gives the head dim d_model / heads = " + n(head_dim()) +
                                     ", which the CPU kernels do not support (a multiple of 16 up to 512)");
  if (lora_rank < 0) throw ArgumentError("lora_rank", "{lora_rank} " + n(lora_rank) + " must not be negative");
  for (bool on : lora)
    if (on && lora_rank == 0) throw ArgumentError("lora_rank", "{lora_rank} 0: LoRA factors need a positive rank");
  if (!std::isfinite(lora_alpha)) throw ArgumentError("lora_alpha", "{lora_alpha} must be a finite number");
  rope.validate(head_dim(), true);  // the documents are the mask's: checked by LoraLayer
}

LoraLayer::LoraLayer(Session& session, const LayerConfig& config, const AttentionSpec& spec)
    : session_(session),
      backend_(session.backend()),
      comm_(session.transport()),
      config_(validated(config, backend_)),
      spec_(spec),
      shard_{config_.batch, 1, config_.heads, config_.kv_heads, config_.head_dim(), api::element_type_of(config_.dtype)},
      // The plan is built now (collective; the arguments are checked on every rank alike), so
      // that no pass allocates while transfers are in flight.
      plan_(session.plan(shard_, spec_, config_.seq_len)),
      ops_(make_layer_ops(backend_, config.threads)) {
  if (config_.rope.per_document && !mask().has_documents())
    throw ArgumentError("rope_per_document", "{rope_per_document} needs documents: {doc_lens}");
  shard_.rows = rows();
  for (int p = 0; p < kProjections; ++p) projections_.emplace_back(config_.shape(p), comm_.size(), comm_.rank());
  rope_ = RopeTable(config_.rope, config_.head_dim(),
                    rope_positions(positions(), mask().doc_offsets(), config_.rope.per_document));
  rotary_ = rope_.table();
  if (rope_.enabled() && backend_.memory() != comm::MemorySpace::host) {
    const size_t n = rope_.cos().size();
    rope_angles_ = buffer(2 * n * sizeof(float));
    backend_.upload(rope_angles_.data(), rope_.cos().data(), n * sizeof(float));
    backend_.upload(rope_angles_.as<float>() + n, rope_.sin().data(), n * sizeof(float));
    rotary_.cos = rope_angles_.as<float>(), rotary_.sin = rope_angles_.as<float>() + n;
  }
  comm::Communicator* c = &comm_;
  ops_->set_progress([c] { c->progress(); });
}

const void* LoraLayer::operand(const float* x, size_t n, const DeviceBuffer& storage) {
  if (config_.dtype == DType::f32) return x;
  if (storage.bytes() < n * sizeof(bf16_bits)) throw std::logic_error("LoraLayer: a bf16 operand buffer is too small");
  ops_->round_to_bf16(storage.as<bf16_bits>(), x, n);
  return storage.data();
}

DeviceBuffer LoraLayer::operand_buffer(int64_t n) {
  return config_.dtype == DType::f32 ? DeviceBuffer() : buffer(sizeof(bf16_bits) * static_cast<size_t>(n));
}

void LoraLayer::run_projections(const std::array<int, kProjections>& order, LayerPassStats& stats,
                                const std::function<void(int, const GatheredProjection&)>& use) {
  const DType type = config_.dtype;
  size_t slot_bytes = 0;
  for (const ShardedProjection& p : projections_)
    slot_bytes = std::max(slot_bytes, GatheredProjection::bytes(p.shape(), type));
  for (DeviceBuffer& slot : slots_) slot = buffer(slot_bytes);
  peak_gathered_bytes_ = std::max(peak_gathered_bytes_, gathered_bytes());
  std::array<GatheredProjection, kProjections> gathered;
  double use_seconds = 0.0;  // in use(), and waiting for the GPU to finish what use() queued
  auto start = [&](int i) {
    const int p = order[static_cast<size_t>(i)];
    gathered[static_cast<size_t>(i)] = GatheredProjection::at(slots_[static_cast<size_t>(i % 2)].data(),
                                                              projections_[static_cast<size_t>(p)].shape(), type);
    // The slot's last user (projection i - 2) is done, and a transport that writes from the host
    // (MPI through host memory) cannot overtake it.
    const Stopwatch compute;
    backend_.synchronize();
    use_seconds += compute.seconds();
    gathers_[static_cast<size_t>(i % 2)].start(comm_, *ops_, projections_[static_cast<size_t>(p)],
                                               mirrors_[static_cast<size_t>(p)].slices(),
                                               gathered[static_cast<size_t>(i)]);
  };
  auto finish = [&](int i) {
    stats.gather_wait_seconds += gathers_[static_cast<size_t>(i % 2)].finish(
        comm_, std::string("the parameters of projection ") + projection_name(order[static_cast<size_t>(i)]));
  };
  start(0);
  finish(0);
  for (int i = 0; i < kProjections; ++i) {
    if (i + 1 < kProjections) start(i + 1);  // arrives while projection i computes
    const Stopwatch t;
    use(order[static_cast<size_t>(i)], gathered[static_cast<size_t>(i)]);
    use_seconds += t.seconds();
    if (i + 1 < kProjections) finish(i + 1);
  }
  const Stopwatch last;
  backend_.synchronize();  // the last projection's GEMMs, before their inputs go
  use_seconds += last.seconds();
  for (DeviceBuffer& slot : slots_) slot = DeviceBuffer();
  stats.projection_seconds = use_seconds - stats.attention_seconds;
}

LayerPassStats LoraLayer::forward(const float* x, float* y) {
  LayerPassStats stats;
  const Stopwatch total;
  const int64_t N = config_.batch * rows(), D = config_.head_dim(), H = config_.heads, Hkv = config_.kv_heads;
  const DType type = config_.dtype;
  const size_t e = static_cast<size_t>(dtype_bytes(type));
  const float s = config_.scaling();
  // What backward needs, allocated once.
  if (!o_.data()) {
    q_ = buffer(e * static_cast<size_t>(N * H * D));
    k_ = buffer(e * static_cast<size_t>(N * Hkv * D));
    v_ = buffer(e * static_cast<size_t>(N * Hkv * D));
    o_ = buffer(floats(N * H * D));
    lse_ = buffer(floats(config_.batch * H * rows()));
    for (int p = 0; p < kProjections; ++p)
      u_[static_cast<size_t>(p)] =
          buffer(e * static_cast<size_t>(N * projections_[static_cast<size_t>(p)].shape().rank));
    o_operand_ = operand_buffer(N * H * D);
  }
  for (int p = 0; p < kProjections; ++p)
    mirrors_[static_cast<size_t>(p)].refresh(projections_[static_cast<size_t>(p)], backend_, type);
  // Every buffer of the pass now, before any transfer is posted. fp32 results on their way to
  // bf16 (with fp32 the results go straight where they are kept).
  DeviceBuffer x_operand = operand_buffer(N * config_.d_model), out, u_out;
  if (type == DType::bf16) {
    out = buffer(floats(N * H * D));
    u_out = buffer(floats(N * config_.lora_rank));
  }
  const void* x_op = operand(x, static_cast<size_t>(N * config_.d_model), x_operand);
  auto project = [&](const GatheredProjection& w, int p, const void* in, float* result) {
    void* u = u_[static_cast<size_t>(p)].data();
    projection_forward(*ops_, w, s, in, N, result, type == DType::f32 ? static_cast<float*>(u) : u_out.as<float>(), u);
  };
  run_projections({kQuery, kKey, kValue, kOutput}, stats, [&](int p, const GatheredProjection& w) {
    if (p == kOutput) return project(w, p, operand(o_.as<float>(), static_cast<size_t>(N * H * D), o_operand_), y);
    DeviceBuffer& kept = p == kQuery ? q_ : p == kKey ? k_ : v_;
    float* result = type == DType::f32 ? kept.as<float>() : out.as<float>();
    project(w, p, x_op, result);
    if (p != kValue && rope_.enabled()) ops_->rotate(result, rotary_, config_.batch, heads_of(p), false);
    if (type == DType::bf16)
      ops_->round_to_bf16(kept.as<bf16_bits>(), result, static_cast<size_t>(N * heads_of(p) * D));
    if (p != kValue) return;
    backend_.synchronize();   // (the projections' time is theirs)
    const Stopwatch t;  // the gather of Wo is in flight meanwhile
    UlyssesAttention& attention = plan_.attention();
    stats.attention =
        ring_stats(attention.forward(q_.data(), k_.data(), v_.data(), o_.as<float>(), lse_.as<float>()), attention);
    stats.attention_seconds = t.seconds();
  });
  have_forward_ = true;
  stats.seconds = total.seconds();
  return stats;
}

LayerPassStats LoraLayer::backward(const float* x, const float* dy, float* dx) {
  if (!have_forward_) throw std::logic_error("LoraLayer::backward called before forward");
  LayerPassStats stats;
  const Stopwatch total;
  const int64_t N = config_.batch * rows(), D = config_.head_dim(), H = config_.heads, Hkv = config_.kv_heads;
  const DType type = config_.dtype;
  const float s = config_.scaling();
  // Full local gradients [A^T (in, r) | B (out, r)] of each projection, over this rank's rows.
  std::array<size_t, kProjections + 1> grad_offset{};
  for (int p = 0; p < kProjections; ++p) {
    const ProjectionShape& sh = projections_[static_cast<size_t>(p)].shape();
    grad_offset[static_cast<size_t>(p) + 1] =
        grad_offset[static_cast<size_t>(p)] + static_cast<size_t>((sh.in + sh.out) * sh.rank);
  }
  DeviceBuffer full = buffer(sizeof(float) * grad_offset[kProjections]);
  backend_.zero(full.data(), full.bytes());
  // Every buffer of the pass now, before any transfer is posted: dO of the attention (fp32, then
  // as the ring stores it), the dQ, dK, dV it returns, du = s dy B, and the bf16 operands.
  DeviceBuffer d_attn = buffer(floats(N * H * D)), dq = buffer(floats(N * H * D)), dk = buffer(floats(N * Hkv * D)),
               dv = buffer(floats(N * Hkv * D)), du = buffer(floats(N * config_.lora_rank));
  const DeviceBuffer du_operand = operand_buffer(N * config_.lora_rank),
                     dy_operand = operand_buffer(N * config_.d_model), d_operand = operand_buffer(N * H * D),
                     x_operand = operand_buffer(N * config_.d_model), d_attn_stored = operand_buffer(N * H * D);
  void* du_op = type == DType::f32 ? du.data() : du_operand.data();
  const void* x_op = operand(x, static_cast<size_t>(N * config_.d_model), x_operand);
  run_projections({kOutput, kValue, kKey, kQuery}, stats, [&](int p, const GatheredProjection& w) {
    float* grad_a_t = full.as<float>() + grad_offset[static_cast<size_t>(p)];
    float* grad_b = grad_a_t + w.shape.in * w.shape.rank;
    const void* u = u_[static_cast<size_t>(p)].data();
    if (p == kOutput) {
      const void* dy_op = operand(dy, static_cast<size_t>(N * config_.d_model), dy_operand);
      const void* o_op = type == DType::f32 ? o_.data() : o_operand_.data();
      projection_backward(*ops_, w, s, o_op, u, dy_op, N, d_attn.as<float>(), false, grad_a_t, grad_b, du.as<float>(),
                          du_op);
      const void* d_out = operand(d_attn.as<float>(), static_cast<size_t>(N * H * D), d_attn_stored);
      backend_.synchronize();   // (the projection's time is its own)
      const Stopwatch t;  // the gather of Wv is in flight meanwhile
      UlyssesAttention& attention = plan_.attention();
      stats.attention = ring_stats(attention.backward(q_.data(), k_.data(), v_.data(), o_.as<float>(), lse_.as<float>(),
                                                      d_out, dq.as<float>(), dk.as<float>(), dv.as<float>(),
                                                      attention.last_forward()),
                                   attention);
      stats.attention_seconds = t.seconds();
      return;
    }
    float* d_proj = (p == kQuery ? dq : p == kKey ? dk : dv).as<float>();
    // The ring's dq, dk are gradients of the rotated q, k: rotate back to those of the projections.
    if (p != kValue && rope_.enabled()) ops_->rotate(d_proj, rotary_, config_.batch, heads_of(p), true);
    const void* d_op = operand(d_proj, static_cast<size_t>(N * heads_of(p) * D), d_operand);
    projection_backward(*ops_, w, s, x_op, u, d_op, N, dx, p != kValue, grad_a_t, grad_b, du.as<float>(), du_op);
  });
  const Stopwatch reduce;
  reduce_scatter_gradients(full.as<float>());
  stats.reduce_seconds = reduce.seconds();
  stats.seconds = total.seconds();
  return stats;
}

// One reduce-scatter for all projections: block q of the send buffer holds, for each projection,
// rank q's rows of dA^T then its rows of dB, which is exactly rank q's lora() layout. Blocks are
// padded to the largest, so that NCCL takes it as one ncclReduceScatter.
void LoraLayer::reduce_scatter_gradients(const float* full) {
  const int P = comm_.size();
  std::vector<size_t> counts(static_cast<size_t>(P), 0);
  for (int q = 0; q < P; ++q)
    for (const ShardedProjection& proj : projections_)
      counts[static_cast<size_t>(q)] += proj.a_elements(q) + proj.b_elements(q);
  const size_t block = *std::max_element(counts.begin(), counts.end());
  for (std::vector<float>& g : grads_) g.clear();
  if (block == 0) return;  // no LoRA factors anywhere
  DeviceBuffer send = buffer(sizeof(float) * block * static_cast<size_t>(P)), mine = buffer(sizeof(float) * block);
  backend_.zero(send.data(), send.bytes());
  for (int q = 0; q < P; ++q) {
    float* to = send.as<float>() + block * static_cast<size_t>(q);
    const float* grads = full;
    for (const ShardedProjection& proj : projections_) {
      const int64_t r = proj.shape().rank;
      const float* b = grads + proj.shape().in * r;
      ops_->copy(to, grads + proj.cols(q).begin * r, sizeof(float) * proj.a_elements(q));
      to += proj.a_elements(q);
      ops_->copy(to, b + proj.rows(q).begin * r, sizeof(float) * proj.b_elements(q));
      to += proj.b_elements(q);
      grads = b + proj.shape().out * r;
    }
  }
  backend_.synchronize();  // a transport that reads from the host (MPI through host memory) reads it now
  comm_.reduce_scatter(send.data(), mine.data(), std::vector<size_t>(static_cast<size_t>(P), block),
                       DType::f32, comm::ReduceOp::sum);
  std::vector<float> host(counts[static_cast<size_t>(comm_.rank())]);
  backend_.download(host.data(), mine.data(), sizeof(float) * host.size());
  size_t offset = 0;
  for (int p = 0; p < kProjections; ++p) {
    const ShardedProjection& proj = projections_[static_cast<size_t>(p)];
    const size_t n = proj.a_elements(comm_.rank()) + proj.b_elements(comm_.rank());
    grads_[static_cast<size_t>(p)].assign(host.begin() + static_cast<ptrdiff_t>(offset),
                                          host.begin() + static_cast<ptrdiff_t>(offset + n));
    offset += n;
  }
}

std::vector<float> LoraLayer::merged_rows(int p) {
  const ShardedProjection& proj = projections_[static_cast<size_t>(p)];
  const ProjectionShape& s = proj.shape();
  std::vector<float> a_t(static_cast<size_t>(s.in * s.rank));
  if (s.has_lora()) {
    std::vector<size_t> bytes(static_cast<size_t>(comm_.size()));
    for (int q = 0; q < comm_.size(); ++q) bytes[static_cast<size_t>(q)] = sizeof(float) * proj.a_elements(q);
    comm_.allgatherv(proj.lora_a_t().data(), a_t.data(), bytes);  // host memory (over MPI with NCCL too)
  }
  return merge_rows(proj, a_t, config_.scaling());
}

size_t LoraLayer::gathered_bytes() const { return slots_[0].bytes() + slots_[1].bytes(); }

size_t LoraLayer::shard_bytes() const {
  size_t n = 0;
  for (const ShardedProjection& p : projections_) n += p.bytes();
  return n;
}

size_t LoraLayer::full_parameter_bytes() const {
  size_t n = 0;
  for (const ShardedProjection& p : projections_) n += p.full_bytes();
  return n;
}

double LoraLayer::projection_flops_forward() const {
  double flops = 0.0;
  const double N = double(config_.batch * rows());
  for (const ShardedProjection& p : projections_) {
    const ProjectionShape& s = p.shape();
    flops += 2.0 * N * double(s.out * s.in + s.rank * (s.in + s.out));
  }
  return flops;
}

}  // namespace ringattn
