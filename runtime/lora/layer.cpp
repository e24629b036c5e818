#include "runtime/lora/layer.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>

#include "comm/stopwatch.hpp"
#include "kernels/cpu/attention_cpu.hpp"
#include "runtime/errors.hpp"

namespace ringattn {

namespace {

const LayerConfig& validated(const LayerConfig& c) {
  c.validate();
  return c;
}

kernels::AttentionDims attention_dims(const LayerConfig& c) {
  const int64_t D = c.head_dim();
  return kernels::AttentionDims{c.batch, c.heads, c.kv_heads, D, 1.0f / std::sqrt(float(D))};
}

// fp32 values in the ring's storage type.
void store(const float* x, size_t n, DType dtype, std::vector<uint8_t>& dst) {
  dst.resize(n * static_cast<size_t>(dtype_bytes(dtype)));
  if (dtype == DType::f32) {
    std::memcpy(dst.data(), x, n * sizeof(float));
    return;
  }
  auto* out = reinterpret_cast<bf16_bits*>(dst.data());
  for (size_t i = 0; i < n; ++i) out[i] = float_to_bf16(x[i]);
}

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

void LayerConfig::validate() const {
  auto n = [](int64_t v) { return std::to_string(v); };
  if (batch < 1 || seq_len < 1 || d_model < 1) throw UsageError("batch, sequence length and d_model must be positive");
  if (heads < 1) throw UsageError("--heads " + n(heads) + ": must be positive");
  if (kv_heads < 1) throw UsageError("--kv-heads " + n(kv_heads) + ": must be positive");
  if (d_model % heads != 0)
    throw UsageError("--heads " + n(heads) + ": d_model " + n(d_model) + " is not divisible by the number of heads");
  if (heads % kv_heads != 0)
    throw UsageError("--kv-heads " + n(kv_heads) + ": must divide --heads " + n(heads) + " (grouped-query attention)");
  if (!kernels::cpu_supports_head_dim(head_dim()))
    throw UsageError("--heads " + n(heads) + ": head dim d_model / H = " + n(head_dim()) +
                     " is not supported (a multiple of 16 up to 512)");
  if (lora_rank < 0) throw UsageError("--lora-rank " + n(lora_rank) + ": must not be negative");
  for (bool on : lora)
    if (on && lora_rank == 0) throw UsageError("--lora-rank: LoRA factors need a positive rank");
  if (!std::isfinite(lora_alpha)) throw UsageError("--lora-alpha: must be a finite number");
  rope.validate(head_dim(), true);  // the documents are the mask's: checked by LoraLayer
}

LoraLayer::LoraLayer(comm::Communicator& comm, const LayerConfig& config, const ShardLayout& layout, const Mask& mask)
    : comm_(comm),
      params_comm_(comm.split(0, comm.rank())),
      config_(validated(config)),
      layout_(layout),
      mask_(mask),
      backend_(make_cpu_backend(config.threads)),
      ring_(comm, *backend_, layout_.kind(), layout_.seq_len(), mask_,
            RingOptions{attention_dims(config), config.dtype, config.schedule}, layout_.ulysses()) {
  if (layout.seq_len() != config.seq_len || layout.ranks() != comm.size())
    throw std::invalid_argument("LoraLayer: the layout does not match the sequence length or the communicator");
  if (config_.rope.per_document && !mask_.has_documents())
    throw UsageError("--rope-per-document needs documents: --doc-lens");
  for (int p = 0; p < kProjections; ++p) projections_.emplace_back(config_.shape(p), comm.size(), comm.rank());
  rope_ = RopeTable(config_.rope, config_.head_dim(),
                    rope_positions(ring_.positions(), mask_.doc_offsets(), config_.rope.per_document));
  set_blas_threads(config.threads);
}

std::function<void()> LoraLayer::progress() {
  comm::Communicator* c = params_comm_.get();
  return [c] { c->progress(); };
}

void LoraLayer::run_projections(const std::array<int, kProjections>& order, LayerPassStats& stats,
                                const std::function<void(int, const GatheredProjection&)>& use) {
  auto start = [&](int i) {
    const size_t slot = static_cast<size_t>(i % 2);
    gathers_[slot].start(*params_comm_, projections_[static_cast<size_t>(order[i])], gathered_[slot], order[i]);
    peak_gathered_bytes_ = std::max(peak_gathered_bytes_, gathered_bytes());
  };
  auto finish = [&](int i) {
    stats.gather_wait_seconds += gathers_[static_cast<size_t>(i % 2)].finish(
        *params_comm_, std::string("the parameters of projection ") + projection_name(order[i]));
  };
  double use_seconds = 0.0;
  start(0);
  finish(0);
  for (int i = 0; i < kProjections; ++i) {
    if (i + 1 < kProjections) start(i + 1);  // arrives while projection i computes
    const comm::Stopwatch t;
    use(order[i], gathered_[static_cast<size_t>(i % 2)]);
    use_seconds += t.seconds();
    if (i + 1 < kProjections) finish(i + 1);
  }
  for (GatheredProjection& g : gathered_) g.release();
  stats.projection_seconds = use_seconds - stats.attention_seconds;
}

LayerPassStats LoraLayer::forward(const float* x, float* y) {
  LayerPassStats stats;
  const comm::Stopwatch total;
  const int64_t N = config_.batch * rows(), D = config_.head_dim();
  const float s = config_.scaling();
  o_.assign(static_cast<size_t>(N * config_.heads * D), 0.0f);
  lse_.assign(static_cast<size_t>(config_.batch * config_.heads * rows()), 0.0f);
  std::vector<float> out;
  auto project = [&](const GatheredProjection& w, int p, const float* in, float* result) {
    u_[static_cast<size_t>(p)].resize(static_cast<size_t>(N * w.shape.rank));
    projection_forward(w, s, in, N, result, u_[static_cast<size_t>(p)].data(), progress());
  };
  run_projections({kQuery, kKey, kValue, kOutput}, stats, [&](int p, const GatheredProjection& w) {
    if (p == kOutput) return project(w, p, o_.data(), y);
    out.resize(static_cast<size_t>(N * w.shape.out));
    project(w, p, x, out.data());
    if (p != kValue) rope_.apply(out.data(), config_.batch, p == kQuery ? config_.heads : config_.kv_heads, false);
    store(out.data(), out.size(), config_.dtype, p == kQuery ? q_ : p == kKey ? k_ : v_);
    if (p != kValue) return;
    const comm::Stopwatch t;  // the gather of Wo is in flight meanwhile
    stats.attention = ring_.forward(q_.data(), k_.data(), v_.data(), o_.data(), lse_.data());
    stats.attention_seconds = t.seconds();
  });
  have_forward_ = true;
  stats.seconds = total.seconds();
  return stats;
}

LayerPassStats LoraLayer::backward(const float* x, const float* dy, float* dx) {
  if (!have_forward_) throw std::logic_error("LoraLayer::backward called before forward");
  LayerPassStats stats;
  const comm::Stopwatch total;
  const int64_t N = config_.batch * rows(), D = config_.head_dim();
  const float s = config_.scaling();
  // Full local gradients [A^T (in, r) | B (out, r)] of each projection, over this rank's rows.
  std::vector<std::vector<float>> full(kProjections);
  for (int p = 0; p < kProjections; ++p) {
    const ProjectionShape& sh = projections_[static_cast<size_t>(p)].shape();
    full[static_cast<size_t>(p)].assign(static_cast<size_t>((sh.in + sh.out) * sh.rank), 0.0f);
  }
  std::vector<float> d_attn(static_cast<size_t>(N * config_.heads * D));  // dO of the attention
  std::vector<float> dq(d_attn.size()), dk(static_cast<size_t>(N * config_.kv_heads * D)), dv(dk.size());
  std::vector<uint8_t> d_attn_stored;
  run_projections({kOutput, kValue, kKey, kQuery}, stats, [&](int p, const GatheredProjection& w) {
    float* grad_a_t = full[static_cast<size_t>(p)].data();
    float* grad_b = grad_a_t + w.shape.in * w.shape.rank;
    const float* u = u_[static_cast<size_t>(p)].data();
    if (p == kOutput) {
      projection_backward(w, s, o_.data(), u, dy, N, d_attn.data(), false, grad_a_t, grad_b, progress());
      store(d_attn.data(), d_attn.size(), config_.dtype, d_attn_stored);
      const comm::Stopwatch t;  // the gather of Wv is in flight meanwhile
      stats.attention = ring_.backward(q_.data(), k_.data(), v_.data(), o_.data(), lse_.data(), d_attn_stored.data(),
                                       dq.data(), dk.data(), dv.data());
      stats.attention_seconds = t.seconds();
      return;
    }
    float* d_proj = p == kQuery ? dq.data() : p == kKey ? dk.data() : dv.data();
    // The ring's dq, dk are gradients of the rotated q, k: rotate back to those of the projections.
    if (p != kValue) rope_.apply(d_proj, config_.batch, p == kQuery ? config_.heads : config_.kv_heads, true);
    projection_backward(w, s, x, u, d_proj, N, dx, p != kValue, grad_a_t, grad_b, progress());
  });
  const comm::Stopwatch reduce;
  reduce_scatter_gradients(full);
  stats.reduce_seconds = reduce.seconds();
  stats.seconds = total.seconds();
  return stats;
}

// One reduce-scatter for all projections: block q of the send buffer holds, for each projection,
// rank q's rows of dA^T then its rows of dB, which is exactly rank q's lora() layout.
void LoraLayer::reduce_scatter_gradients(std::vector<std::vector<float>>& full) {
  const int P = comm_.size();
  std::vector<size_t> counts(static_cast<size_t>(P), 0);
  std::vector<float> send;
  for (int q = 0; q < P; ++q)
    for (int p = 0; p < kProjections; ++p) {
      const ShardedProjection& proj = projections_[static_cast<size_t>(p)];
      const int64_t r = proj.shape().rank;
      if (r == 0) continue;
      const float* a_t = full[static_cast<size_t>(p)].data();
      const float* b = a_t + proj.shape().in * r;
      send.insert(send.end(), a_t + proj.cols(q).begin * r, a_t + proj.cols(q).begin * r + proj.a_elements(q));
      send.insert(send.end(), b + proj.rows(q).begin * r, b + proj.rows(q).begin * r + proj.b_elements(q));
      counts[static_cast<size_t>(q)] += proj.a_elements(q) + proj.b_elements(q);
    }
  full.clear();
  if (send.empty()) return;
  std::vector<float> mine(counts[static_cast<size_t>(comm_.rank())]);
  params_comm_->reduce_scatter(send.data(), mine.data(), counts, comm::DataType::f32, comm::ReduceOp::sum);
  size_t offset = 0;
  for (int p = 0; p < kProjections; ++p) {
    const size_t n = projections_[static_cast<size_t>(p)].lora().size();
    grads_[static_cast<size_t>(p)].assign(mine.begin() + static_cast<ptrdiff_t>(offset),
                                          mine.begin() + static_cast<ptrdiff_t>(offset + n));
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
    params_comm_->allgatherv(proj.lora_a_t().data(), a_t.data(), bytes);
  }
  return merge_rows(proj, a_t, config_.scaling());
}

size_t LoraLayer::gathered_bytes() const {
  size_t n = 0;
  for (const GatheredProjection& g : gathered_)
    n += sizeof(float) * (g.w0.capacity() + g.a_t.capacity() + g.b.capacity());
  return n;
}

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
