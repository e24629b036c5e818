#include "runtime/api/arguments.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <string>

#include "kernels/cpu/attention_cpu.hpp"
#include "runtime/cuda_backend.hpp"
#include "runtime/placement.hpp"
#if defined(RINGATTN_WITH_CUDA)
#include "kernels/cuda/attention_cuda.hpp"
#endif

namespace ringattn::api {

namespace {

std::string n(int64_t v) { return std::to_string(v); }

// "{name} <message>": the argument leads its message.
ArgumentError bad(const std::string& argument, const std::string& message,
                  ArgumentError::Kind kind = ArgumentError::Kind::value) {
  return ArgumentError(argument, "{" + argument + "} " + message, kind);
}

}  // namespace

DType dtype_of(ElementType type) {
  switch (type) {
    case ElementType::bfloat16: return DType::bf16;
    case ElementType::float16: return DType::f16;
    default: return DType::f32;
  }
}

ElementType element_type_of(DType dtype) {
  switch (dtype) {
    case DType::f32: return ElementType::float32;
    case DType::bf16: return ElementType::bfloat16;
    case DType::f16: return ElementType::float16;
    default: throw std::invalid_argument(std::string("no public element type for ") + dtype_name(dtype));
  }
}

uint64_t fnv1a(const void* data, size_t bytes, uint64_t h) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < bytes; ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

bool scale_fits_fp32(double scale) {
  return scale >= double(std::numeric_limits<float>::min()) && scale <= double(std::numeric_limits<float>::max());
}

std::optional<ArgumentError> check_options(const ContextOptions& o) {
  if (o.backend != "cpu" && o.backend != "cuda") return bad("backend", "'" + o.backend + "': expected cpu or cuda");
  if (o.comm != "mpi" && o.comm != "nccl") return bad("comm", "'" + o.comm + "': expected mpi or nccl");
  if (o.comm == "nccl" && o.backend != "cuda")
    return bad("comm", "nccl needs {backend} cuda (NCCL moves device memory)");
#if !defined(RINGATTN_WITH_CUDA)
  if (o.backend == "cuda") return bad("backend", "cuda: this build has no CUDA backend");
#else
  if (o.backend == "cuda" && !cuda_device_available()) return bad("backend", "cuda: no GPU is visible on this node");
#endif
#if !defined(RINGATTN_WITH_NCCL)
  if (o.comm == "nccl") return bad("comm", "nccl: this build has no NCCL communicator");
#endif
  if (o.threads < 0) return bad("threads", n(o.threads) + " must be >= 0 (0: automatic)");
  if (!(o.timeout_s > 0) || !std::isfinite(o.timeout_s)) return bad("timeout_s", "must be a positive number of seconds");
  const std::pair<const char*, double> links[] = {{"emulate_bandwidth_gbps", o.emulate_bandwidth_gbps},
                                                  {"emulate_latency_us", o.emulate_latency_us},
                                                  {"emulate_intra_bandwidth_gbps", o.emulate_intra_bandwidth_gbps},
                                                  {"emulate_intra_latency_us", o.emulate_intra_latency_us}};
  for (const auto& [name, value] : links) {
    if (!(value >= 0) || !std::isfinite(value)) return bad(name, "must be a finite number >= 0 (0: not emulated)");
    if (value > 0 && o.comm == "nccl")
      return bad(name, "emulates a slower link under MPI's transfers; with {comm} nccl nothing would be emulated");
  }
  return std::nullopt;
}

std::optional<ArgumentError> check_shard(const Shard& s, bool cuda) {
  for (auto [name, value] : {std::pair<const char*, int64_t>{"batch", s.batch}, {"heads", s.heads},
                             {"kv_heads", s.kv_heads}, {"head_dim", s.head_dim}})
    if (value < 1) return bad(name, n(value) + " must be positive");
  if (s.dtype != ElementType::float32 && s.dtype != ElementType::bfloat16 && s.dtype != ElementType::float16)
    return bad("dtype", "is not an ElementType", ArgumentError::Kind::type);
  if (cuda) {
#if defined(RINGATTN_WITH_CUDA)
    if (!kernels::cuda_supports_head_dim(s.head_dim))
      return bad("head_dim", n(s.head_dim) + " is not supported by the CUDA kernels (1 to 256)");
#endif
  } else {
    if (!kernels::cpu_supports_head_dim(s.head_dim))
      return bad("head_dim", n(s.head_dim) + " is not supported by the CPU kernels (multiples of 16 up to 512)");
    if (s.dtype == ElementType::float16)
      return bad("dtype", "float16 is not supported by the CPU kernels (float32 or bfloat16; float16 runs on CUDA)",
                 ArgumentError::Kind::type);
  }
  if (s.heads % s.kv_heads != 0)
    return bad("kv_heads", n(s.kv_heads) + " must divide {heads} " + n(s.heads) +
                               " (grouped-query attention: each key/value head serves an equal group of query heads)");
  return std::nullopt;
}

std::optional<ArgumentError> check_spec(const AttentionSpec& spec) {
  const MaskSpec& m = spec.mask;
  if (m.window_left < -1 || m.window_right < -1)
    return bad("window", "(" + n(m.window_left) + ", " + n(m.window_right) +
                             "): sides must be >= 0, or -1 for unbounded");
  if (m.mask_block < 1) return bad("mask_block", n(m.mask_block) + " must be positive");
  if (m.has_bigbird()) {
    if (m.bigbird_global < 0 || m.bigbird_window < 0 || m.bigbird_random < 0)
      return bad("bigbird", "GLOBAL, WINDOW and RANDOM must all be >= 0");
    if (!m.block_mask.empty()) return bad("block_mask", "and {bigbird} both give a block mask: use one");
  }
  for (int64_t len : m.doc_lens)
    if (len < 0) return bad("doc_lens", "must not be negative (" + n(len) + ")");
  char scale[32];
  std::snprintf(scale, sizeof scale, "%g", spec.softmax_scale);
  if (!std::isfinite(spec.softmax_scale) || spec.softmax_scale < 0)
    return bad("softmax_scale", std::string(scale) + " must be a finite positive number");
  if (spec.softmax_scale > 0 && !scale_fits_fp32(spec.softmax_scale))
    return bad("softmax_scale", std::string(scale) + " must lie within " + kScaleRange);
  if (spec.layout != SequenceLayout::automatic && spec.layout != SequenceLayout::contiguous &&
      spec.layout != SequenceLayout::zigzag && spec.layout != SequenceLayout::striped)
    return bad("layout", "expected contiguous, zigzag or striped");
  if (spec.schedule != KeyValueSchedule::direct && spec.schedule != KeyValueSchedule::ring)
    return bad("schedule", "expected direct or ring");
  if (spec.kernel != AttentionKernel::automatic && spec.kernel != AttentionKernel::cudnn &&
      spec.kernel != AttentionKernel::own)
    return bad("kernel", "expected auto, cudnn or own");
  if (spec.ulysses < 1) return bad("ulysses", n(spec.ulysses) + " must be at least 1 (1: the ring alone)");
  return std::nullopt;
}

std::optional<ArgumentError> check_call(const Shard& shard, const AttentionSpec& spec, int64_t L, int ranks) {
  if (L < ranks)
    return bad("seq_len", n(L) + " is smaller than the number of ranks " + n(ranks) +
                              ": every rank needs at least one position");
  if (auto e = check_mask_length(spec.mask, L)) return e;
  return check_ulysses(spec.ulysses, ranks, shard.heads, shard.kv_heads);
}

std::optional<ArgumentError> check_mask_length(const MaskSpec& m, int64_t L) {
  if (!m.doc_lens.empty()) {
    int64_t sum = 0;
    for (int64_t len : m.doc_lens)
      if (__builtin_add_overflow(sum, len, &sum)) return bad("doc_lens", "overflow 64 bits when summed");
    if (sum != L) return bad("doc_lens", "sum to " + n(sum) + " but the sequence length is " + n(L));
  }
  const int64_t blocks = L / m.mask_block + (L % m.mask_block != 0);
  if (!m.block_mask.empty() && static_cast<int64_t>(m.block_mask.size()) != blocks * blocks)
    return bad("block_mask", "has " + n(static_cast<int64_t>(m.block_mask.size())) + " entries, but sequence length " +
                                 n(L) + " with {mask_block} " + n(m.mask_block) + " needs " + n(blocks) + " x " +
                                 n(blocks));
  return std::nullopt;
}

LayoutKind layout_kind(const AttentionSpec& spec) {
  switch (spec.layout) {
    case SequenceLayout::contiguous: return LayoutKind::contiguous;
    case SequenceLayout::zigzag: return LayoutKind::zigzag;
    case SequenceLayout::striped: return LayoutKind::striped;
    default: return spec.mask.causal ? LayoutKind::zigzag : LayoutKind::contiguous;
  }
}

Mask build_mask(const AttentionSpec& spec, int64_t L) {
  const MaskSpec& m = spec.mask;
  Mask mask;
  mask.causal = m.causal;
  // A side longer than the sequence reaches every key, as L does (and i + RIGHT cannot overflow).
  mask.window_left = m.window_left < 0 ? kUnboundedWindow : std::min(m.window_left, L);
  mask.window_right = m.window_right < 0 ? kUnboundedWindow : std::min(m.window_right, L);
  if (m.window_left >= 0 || m.window_right >= 0)  // the summary's mask, as given
    mask.window_origin = std::to_string(m.window_left) + "," + std::to_string(m.window_right);
  if (!m.doc_lens.empty()) mask.set_documents(m.doc_lens);
  const int64_t blocks = L / m.mask_block + (L % m.mask_block != 0);
  if (!m.block_mask.empty()) {
    mask.set_block_mask(m.block_mask, blocks, m.mask_block);
    mask.block_mask_origin = "block";
  }
  if (m.has_bigbird()) {
    // Counts beyond the number of blocks mean "all of them" (and keep r + WINDOW from overflowing).
    mask.set_block_mask(bigbird_block_mask(blocks, std::min(m.bigbird_global, blocks),
                                           std::min(m.bigbird_window, blocks), std::min(m.bigbird_random, blocks),
                                           m.bigbird_seed),
                        blocks, m.mask_block);
    mask.block_mask_origin = "bigbird(" + std::to_string(m.bigbird_global) + "," + std::to_string(m.bigbird_window) +
                             "," + std::to_string(m.bigbird_random) + ")";
  }
  return mask;
}

float softmax_scale(const AttentionSpec& spec, int64_t head_dim) {
  return spec.softmax_scale > 0 ? static_cast<float>(spec.softmax_scale)
                                : static_cast<float>(1.0 / std::sqrt(double(head_dim)));
}

RingOptions ring_options(const Shard& s, const AttentionSpec& spec) {
  RingOptions o;
  o.dims.batch = s.batch;
  o.dims.heads = s.heads;
  o.dims.kv_heads = s.kv_heads;
  o.dims.head_dim = s.head_dim;
  o.dims.scale = softmax_scale(spec, s.head_dim);
  o.dtype = dtype_of(s.dtype);
  o.schedule = spec.schedule == KeyValueSchedule::ring ? Schedule::ring : Schedule::direct;
  o.kernel = spec.kernel == AttentionKernel::cudnn ? KernelChoice::cudnn
             : spec.kernel == AttentionKernel::own ? KernelChoice::own
                                                   : KernelChoice::automatic;
  o.deterministic = spec.deterministic;
  return o;
}

std::string plan_key(const Shard& s, const AttentionSpec& spec, int64_t L) {
  const MaskSpec& m = spec.mask;
  std::string key;
  auto add = [&](int64_t x) { key.append(reinterpret_cast<const char*>(&x), sizeof x); };
  for (int64_t x : {s.batch, s.heads, s.kv_heads, s.head_dim, int64_t(s.dtype), L, int64_t(m.causal), m.window_left,
                    m.window_right, m.mask_block, m.bigbird_global, m.bigbird_window, m.bigbird_random,
                    int64_t(m.bigbird_seed), int64_t(layout_kind(spec)), int64_t(spec.schedule), int64_t(spec.ulysses),
                    int64_t(spec.kernel), int64_t(spec.deterministic)})
    add(x);
  int64_t scale_bits = 0;
  std::memcpy(&scale_bits, &spec.softmax_scale, sizeof scale_bits);
  add(scale_bits);
  add(static_cast<int64_t>(m.doc_lens.size()));
  for (int64_t len : m.doc_lens) add(len);
  add(static_cast<int64_t>(m.block_mask.size()));
  add(static_cast<int64_t>(fnv1a(m.block_mask.data(), m.block_mask.size())));
  return key;
}

void copy_text(char* dst, size_t capacity, const std::string& s) {
  const size_t n = std::min(capacity - 1, s.size());
  std::memcpy(dst, s.data(), n);
  dst[n] = '\0';
}

}  // namespace ringattn::api
