// The CUDA backend's cuDNN path (runtime/cudnn_steps.hpp).
#include "runtime/cudnn_steps.hpp"

#include <algorithm>
#include <cstdio>
#include <cstring>

#include "kernels/cuda/elementwise.hpp"
#include "kernels/cuda/sdpa_glue.hpp"
#include "runtime/errors.hpp"

namespace ringattn {

using kernels::cudnn::SdpaCall;
using kernels::cudnn::SdpaGraphShape;
using kernels::cudnn::SdpaPass;
using kernels::cudnn::SdpaSegment;

namespace {

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess)
    throw Fault(std::string("CUDA backend (cuDNN path): ") + what + ": " + cudaGetErrorName(e) + " (" +
                       cudaGetErrorString(e) + ")");
}

constexpr size_t kAlign = 16;
size_t aligned(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

// Appends bytes to the arena being built, 16-byte aligned; returns their offset.
size_t append(std::vector<unsigned char>& arena, const void* data, size_t bytes) {
  const size_t at = aligned(arena.size());
  arena.resize(at + bytes);
  if (bytes) std::memcpy(arena.data() + at, data, bytes);
  return at;
}

// cuDNN's deterministic backward with a workspace linear in the shard (sdpa_engine.hpp).
bool deterministic_backward_available(int version, int sm) {
  return (sm == 90 && version >= kernels::cudnn::kLinearDeterministicVersion) || (sm >= 100 && version >= 91800);
}

}  // namespace

class CudnnSteps::Buffer {
 public:
  Buffer() = default;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  ~Buffer() {
    if (p_) cudaFree(p_);
  }
  void reserve(size_t bytes) {
    if (bytes <= bytes_) return;
    if (p_) check(cudaFree(p_), "cudaFree");
    p_ = nullptr;
    check(cudaMalloc(&p_, bytes), "allocating cuDNN buffers");
    bytes_ = bytes;
  }
  template <class T = void>
  T* get() const {
    return static_cast<T*>(p_);
  }
  size_t bytes() const { return bytes_; }

 private:
  void* p_ = nullptr;
  size_t bytes_ = 0;
};

// The host metadata of one call, appended to `arena`: per-sequence lengths, ragged offsets
// (elements, one per sequence and the end), the segment table, the tile mask's bits.
CudnnSteps::MetaOffsets CudnnSteps::append_meta(const SdpaCall& c, const kernels::AttentionDims& d, int64_t q_rows,
                                                int64_t k_rows, std::vector<unsigned char>& arena) {
  MetaOffsets m;
  const int64_t nseg = int64_t(c.segments.size()), batch = d.batch * (c.ragged ? nseg : 1);
  if (c.padding) {
    std::vector<int32_t> sq(static_cast<size_t>(batch)), skv(static_cast<size_t>(batch));
    for (int64_t n = 0; n < batch; ++n) {
      const SdpaSegment& s = c.segments[size_t(n % nseg)];
      sq[size_t(n)] = int32_t(c.ragged ? s.q_rows : c.max_q_rows());
      skv[size_t(n)] = int32_t(c.ragged ? s.k_rows : c.max_k_rows());
    }
    m.seq_q = append(arena, sq.data(), sq.size() * 4);
    m.seq_kv = append(arena, skv.data(), skv.size() * 4);
  }
  if (c.ragged) {
    std::vector<int32_t> rq(static_cast<size_t>(batch + 1)), rk(static_cast<size_t>(batch + 1));
    const int64_t q_row = d.heads * d.head_dim, k_row = d.kv_heads * d.head_dim;
    for (int64_t n = 0; n < batch; ++n) {
      const SdpaSegment& s = c.segments[size_t(n % nseg)];
      rq[size_t(n)] = int32_t(((n / nseg) * q_rows + s.q_row0) * q_row);
      rk[size_t(n)] = int32_t(((n / nseg) * k_rows + s.k_row0) * k_row);
    }
    const SdpaSegment& last = c.segments.back();
    rq[size_t(batch)] = int32_t(((d.batch - 1) * q_rows + last.q_row0 + last.q_rows) * q_row);
    rk[size_t(batch)] = int32_t(((d.batch - 1) * k_rows + last.k_row0 + last.k_rows) * k_row);
    m.ragged_q = append(arena, rq.data(), rq.size() * 4);
    m.ragged_kv = append(arena, rk.data(), rk.size() * 4);
  }
  m.segments = append(arena, c.segments.data(), c.segments.size() * sizeof(SdpaSegment));
  if (c.has_tiles()) {  // bit (c / 128) % 8 of byte (c / 128) / 8 of each tile row, LSB first
    const int64_t bytes = (c.tiles_k + 7) / 8;
    std::vector<uint8_t> bits(size_t(c.tiles_q * bytes), 0);
    for (int64_t tq = 0; tq < c.tiles_q; ++tq)
      for (int64_t tk = 0; tk < c.tiles_k; ++tk)
        if (c.tiles[size_t(tq * c.tiles_k + tk)]) bits[size_t(tq * bytes + tk / 8)] |= uint8_t(1u << (tk % 8));
    m.tiles = append(arena, bits.data(), bits.size());
  }
  return m;
}

CudnnSteps::CudnnSteps(cudaStream_t stream)
    : stream_(stream),
      engine_(kernels::cudnn::make_sdpa_engine()),
      workspace_(new Buffer),
      o_call_(new Buffer),
      stats_(new Buffer),
      o_in_(new Buffer),
      dq_call_(new Buffer),
      dk_call_(new Buffer),
      dv_call_(new Buffer) {}

CudnnSteps::~CudnnSteps() = default;

std::string CudnnSteps::status() const { return engine_->describe(); }

std::string CudnnSteps::unsupported(const kernels::AttentionDims& dims, DType dtype) const {
  if (!engine_->available()) return engine_->describe();
  if (dtype != DType::bf16)
    return std::string("cuDNN's fused attention runs bf16 inputs here, not ") + dtype_name(dtype);
  // cudnn-frontend 1.32: head dims multiples of 8, at most 256 on Hopper, 128 elsewhere (9.x).
  const int64_t most = engine_->sm_version() == 90 ? 256 : 128;
  if (dims.head_dim % 8 != 0 || dims.head_dim > most)
    return "head dim " + std::to_string(dims.head_dim) + ": cuDNN's fused attention takes multiples of 8 up to " +
           std::to_string(most) + " on this GPU";
  return "";
}

// Plans one pass of one step and builds its graphs; false (our kernels) when the planner or
// cuDNN refuses any of its calls.
bool CudnnSteps::plan_pass(const PrepareRequest& r, const StepPositions& sp, SdpaPass pass, Step& step,
                           std::vector<unsigned char>& host_meta) {
  const int version = engine_->version(), sm = engine_->sm_version();
  const bool deterministic = pass == SdpaPass::backward && r.deterministic;
  if (deterministic && !deterministic_backward_available(version, sm)) return false;
  const int64_t elements = r.dims.batch * std::max(sp.q_rows, sp.k_rows) * r.dims.heads * r.dims.head_dim;
  const kernels::cudnn::StepPlan plan = kernels::cudnn::plan_step(
      r.mask, {sp.q_pos, sp.q_rows}, {sp.k_pos, sp.k_rows}, kernels::cudnn::capabilities(version, sm, elements), pass);
  if (!plan.cudnn) return false;
  std::vector<Call> calls;
  std::vector<unsigned char> meta = host_meta;
  for (const SdpaCall& c : plan.calls) {
    Call call;
    call.shape = kernels::cudnn::graph_shape(c, pass, r.dims, r.dtype, sp.q_rows, sp.k_rows, deterministic);
    call.segments = c.segments;
    std::string why;
    if (!engine_->prepare(call.shape, &why)) return false;
    const size_t ws = engine_->workspace_bytes(call.shape);
    // A deterministic workspace that grows with s_q x s_kv (cuDNN before 9.25 on Hopper) is not ours to give.
    const double linear = 16.0 * double(call.shape.batch * call.shape.heads * call.shape.head_dim) *
                              double(call.shape.s_q + call.shape.s_kv) +
                          double(64 << 20);
    if (deterministic && double(ws) > linear) return false;
    workspace_->reserve(ws);
    call.meta = append_meta(c, r.dims, sp.q_rows, sp.k_rows, meta);
    stats_->reserve(sizeof(float) * size_t(call.shape.batch * call.shape.heads * call.shape.s_q));
    calls.push_back(std::move(call));
  }
  host_meta = std::move(meta);
  (pass == SdpaPass::forward ? step.forward_calls : step.backward_calls) = std::move(calls);
  return true;
}

std::vector<int> CudnnSteps::prepare(const PrepareRequest& r) {
  std::vector<int> ids(r.steps.size(), -1);
  if (r.kernel == KernelChoice::own) return ids;
  const std::string problem = unsupported(r.dims, r.dtype);
  if (!engine_->available() && r.dtype == DType::bf16 && !said_unavailable_) {  // once per backend
    std::fprintf(stderr, "ringattn: note: %s: our kernels run every attention step\n", problem.c_str());
    said_unavailable_ = true;
  }
  if (!problem.empty()) return ids;
  const size_t q_row = size_t(r.dims.heads * r.dims.head_dim), k_row = size_t(r.dims.kv_heads * r.dims.head_dim);
  for (size_t t = 0; t < r.steps.size(); ++t) {
    const StepPositions& sp = r.steps[t];
    Step step;
    step.dims = r.dims, step.dtype = r.dtype, step.q_rows = sp.q_rows, step.k_rows = sp.k_rows;
    std::vector<unsigned char> host_meta;
    step.forward = plan_pass(r, sp, SdpaPass::forward, step, host_meta);
    step.backward = plan_pass(r, sp, SdpaPass::backward, step, host_meta);
    if (!step.forward && !step.backward) continue;
    const size_t b = size_t(r.dims.batch);
    o_call_->reserve(2 * b * size_t(sp.q_rows) * q_row);
    if (step.backward) {
      o_in_->reserve(2 * b * size_t(sp.q_rows) * q_row);
      dq_call_->reserve(2 * b * size_t(sp.q_rows) * q_row);
      dk_call_->reserve(2 * b * size_t(sp.k_rows) * k_row);
      dv_call_->reserve(2 * b * size_t(sp.k_rows) * k_row);
    }
    step.arena = std::make_shared<Buffer>();
    step.arena->reserve(std::max<size_t>(host_meta.size(), 1));
    check(cudaMemcpy(step.arena->get(), host_meta.data(), host_meta.size(), cudaMemcpyHostToDevice),
          "uploading the cuDNN calls' metadata");
    ids[t] = next_id_++;
    steps_.emplace(ids[t], std::move(step));
  }
  return ids;
}

void CudnnSteps::forget(const std::vector<int>& ids) {
  for (int id : ids) steps_.erase(id);
}

CudnnSteps::Meta CudnnSteps::meta(const Step& step, const Call& call) {
  const MetaOffsets& m = call.meta;
  const unsigned char* base = step.arena->get<unsigned char>();
  auto at = [&](size_t off) { return off == MetaOffsets::npos ? nullptr : base + off; };
  Meta out;
  out.seq_q = reinterpret_cast<const int32_t*>(at(m.seq_q));
  out.seq_kv = reinterpret_cast<const int32_t*>(at(m.seq_kv));
  out.ragged_q = reinterpret_cast<const int32_t*>(at(m.ragged_q));
  out.ragged_kv = reinterpret_cast<const int32_t*>(at(m.ragged_kv));
  out.segments = reinterpret_cast<const SdpaSegment*>(at(m.segments));
  out.tiles = at(m.tiles);
  return out;
}

const CudnnSteps::Step* CudnnSteps::find(const kernels::AttentionDims& dims, DType dtype, const kernels::QueryRows& q,
                                         const kernels::KeyValueRows& kv) const {
  const auto it = steps_.find(kv.step);
  if (it == steps_.end()) return nullptr;
  const Step& s = it->second;
  const bool same = s.dims.batch == dims.batch && s.dims.heads == dims.heads && s.dims.kv_heads == dims.kv_heads &&
                    s.dims.head_dim == dims.head_dim && s.dims.scale == dims.scale && s.dtype == dtype &&
                    q.dtype == dtype && kv.dtype == dtype && s.q_rows == q.rows && s.k_rows == kv.rows;
  return same ? &s : nullptr;
}

bool CudnnSteps::forward(const kernels::AttentionDims& dims, const kernels::QueryRows& q,
                         const kernels::KeyValueRows& kv, const kernels::AttentionState& state) {
  const Step* step = find(dims, q.dtype, q, kv);
  if (!step || !step->forward) return false;
  const int64_t q_row = dims.heads * dims.head_dim, k_row = dims.kv_heads * dims.head_dim;
  auto* o_call = o_call_->get<bf16_bits>();
  for (const Call& call : step->forward_calls) {
    const Meta m = meta(*step, call);
    const SdpaSegment& first = call.segments[0];
    const int64_t qo = call.shape.ragged ? 0 : first.q_row0 * q_row, ko = call.shape.ragged ? 0 : first.k_row0 * k_row;
    kernels::cudnn::SdpaForwardArgs a;
    a.q = static_cast<const bf16_bits*>(q.data) + qo;
    a.k = static_cast<const bf16_bits*>(kv.k) + ko;
    a.v = static_cast<const bf16_bits*>(kv.v) + ko;
    a.o = o_call + qo;
    a.stats = stats_->get<float>();
    a.seq_len_q = m.seq_q, a.seq_len_kv = m.seq_kv, a.ragged_q = m.ragged_q, a.ragged_kv = m.ragged_kv;
    a.tile_mask = m.tiles;
    a.workspace = workspace_->get();
    a.stream = stream_;
    engine_->run_forward(call.shape, a);
    kernels::cuda_merge_sdpa_output(dims, q.rows, m.segments, int64_t(call.segments.size()), call.shape.s_q, o_call,
                                    a.stats, state, stream_);
  }
  ran_forward_ = true;
  return true;
}

void CudnnSteps::begin_backward(const kernels::AttentionDims& dims, int64_t rows, const float* o, DType dtype) {
  const size_t n = size_t(dims.batch * rows * dims.heads * dims.head_dim);
  const bool needed = std::any_of(steps_.begin(), steps_.end(), [&](const auto& s) {
    return s.second.backward && s.second.dtype == dtype && s.second.q_rows == rows;
  });
  if (needed && o_in_->bytes() >= 2 * n) kernels::cuda_round_to_bf16(o_in_->get<bf16_bits>(), o, n, stream_);
}

bool CudnnSteps::backward(const kernels::AttentionDims& dims, const kernels::QueryRows& q,
                          const kernels::KeyValueRows& kv, const void* dout, const float* lse, float* dq, float* dk,
                          float* dv) {
  const Step* step = find(dims, q.dtype, q, kv);
  if (!step || !step->backward) return false;
  const int64_t q_row = dims.heads * dims.head_dim, k_row = dims.kv_heads * dims.head_dim;
  auto *dq_call = dq_call_->get<bf16_bits>(), *dk_call = dk_call_->get<bf16_bits>(),
       *dv_call = dv_call_->get<bf16_bits>();
  for (const Call& call : step->backward_calls) {
    const Meta m = meta(*step, call);
    const int64_t nseg = int64_t(call.segments.size());
    const SdpaSegment& first = call.segments[0];
    const int64_t qo = call.shape.ragged ? 0 : first.q_row0 * q_row, ko = call.shape.ragged ? 0 : first.k_row0 * k_row;
    kernels::cuda_gather_sdpa_stats(dims, q.rows, m.segments, nseg, call.shape.s_q, lse, stats_->get<float>(), stream_);
    kernels::cudnn::SdpaBackwardArgs a;
    a.q = static_cast<const bf16_bits*>(q.data) + qo;
    a.k = static_cast<const bf16_bits*>(kv.k) + ko;
    a.v = static_cast<const bf16_bits*>(kv.v) + ko;
    a.o = o_in_->get<bf16_bits>() + qo;
    a.dout = static_cast<const bf16_bits*>(dout) + qo;
    a.stats = stats_->get<float>();
    a.dq = dq_call + qo, a.dk = dk_call + ko, a.dv = dv_call + ko;
    a.seq_len_q = m.seq_q, a.seq_len_kv = m.seq_kv, a.ragged_q = m.ragged_q, a.ragged_kv = m.ragged_kv;
    a.workspace = workspace_->get();
    a.stream = stream_;
    engine_->run_backward(call.shape, a);
    for (const SdpaSegment& s : call.segments) {
      kernels::cuda_add_sdpa_rows(dq, dq_call, dims.batch, q.rows, q_row, s.q_row0, s.q_rows, stream_);
      kernels::cuda_add_sdpa_rows(dk, dk_call, dims.batch, kv.rows, k_row, s.k_row0, s.k_rows, stream_);
      kernels::cuda_add_sdpa_rows(dv, dv_call, dims.batch, kv.rows, k_row, s.k_row0, s.k_rows, stream_);
    }
  }
  ran_backward_ = true;
  return true;
}

}  // namespace ringattn
