#include "runtime/api/arguments.hpp"

#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <string>

#include "kernels/cpu/attention_cpu.hpp"
#if defined(RINGATTN_WITH_CUDA)
#include "kernels/cuda/attention_cuda.hpp"
#endif

namespace ringattn::api {

namespace {

ArgumentError ok() { return ArgumentError("", ""); }
ArgumentError bad(const std::string& argument, const std::string& what) {
  return ArgumentError(argument, argument + ": " + what);
}

}  // namespace

uint64_t fnv1a(const void* data, size_t bytes, uint64_t h) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < bytes; ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

bool scale_fits_fp32(double scale) {
  return scale >= double(std::numeric_limits<float>::min()) && scale <= double(std::numeric_limits<float>::max());
}

ArgumentError check_local(const Shard& s, const AttentionSpec& spec, bool cuda) {
  if (s.batch < 1) return bad("q", "batch " + std::to_string(s.batch) + " must be positive");
  if (s.rows < 1) return bad("q", "this rank's rows (" + std::to_string(s.rows) + ") must be positive");
  if (s.heads < 1) return bad("q", "heads " + std::to_string(s.heads) + " must be positive");
  if (s.head_dim < 1) return bad("q", "head dim " + std::to_string(s.head_dim) + " must be positive");
#if defined(RINGATTN_WITH_CUDA)
  if (cuda && !kernels::cuda_supports_head_dim(s.head_dim))
    return bad("q", "head dim " + std::to_string(s.head_dim) + " is not supported by the CUDA kernels (1 to 256)");
#endif
  if (!cuda && !kernels::cpu_supports_head_dim(s.head_dim))
    return bad("q", "head dim " + std::to_string(s.head_dim) +
                        " is not supported by the CPU kernels (multiples of 16 up to 512)");
  if (s.kv_heads < 1 || s.heads % s.kv_heads != 0)
    return bad("k", "its " + std::to_string(s.kv_heads) + " heads must divide q's " + std::to_string(s.heads) +
                        " (GQA: query head h uses key/value head h / (H / Hkv))");
  if (s.dtype != ElementType::float32 && s.dtype != ElementType::bfloat16)
    return ArgumentError("q", "q: the element type must be float32 or bfloat16", ArgumentError::Kind::type);
  const MaskSpec& m = spec.mask;
  if (m.window_left < -1 || m.window_right < -1)
    return bad("window", "(" + std::to_string(m.window_left) + ", " + std::to_string(m.window_right) +
                             "): sides must be >= 0, or -1 for unbounded");
  if (m.mask_block < 1) return bad("mask_block", std::to_string(m.mask_block) + " must be positive");
  if (m.has_bigbird()) {
    if (m.bigbird_global < 0 || m.bigbird_window < 0 || m.bigbird_random < 0)
      return bad("bigbird", "GLOBAL, WINDOW and RANDOM must all be >= 0");
    if (!m.block_mask.empty()) return bad("bigbird", "block_mask and bigbird both give a block mask: use one");
  }
  for (int64_t n : m.doc_lens)
    if (n < 0) return bad("doc_lens", "document lengths must not be negative (" + std::to_string(n) + ")");
  if (!std::isfinite(spec.softmax_scale) || spec.softmax_scale < 0)
    return bad("softmax_scale", "must be a finite positive number (or 0 for 1/sqrt(head_dim))");
  if (spec.softmax_scale > 0 && !scale_fits_fp32(spec.softmax_scale)) {
    char got[32];
    std::snprintf(got, sizeof got, "%g", spec.softmax_scale);
    return bad("softmax_scale", std::string("must lie within ") + kScaleRange + " (got " + got + ")");
  }
  if (spec.layout != SequenceLayout::automatic && spec.layout != SequenceLayout::contiguous &&
      spec.layout != SequenceLayout::zigzag && spec.layout != SequenceLayout::striped)
    return bad("layout", "expected contiguous, zigzag or striped");
  if (spec.schedule != KeyValueSchedule::direct && spec.schedule != KeyValueSchedule::ring)
    return bad("schedule", "expected direct or ring");
  return ok();
}

ArgumentError check_with_length(const AttentionSpec& spec, int64_t L) {
  const MaskSpec& m = spec.mask;
  if (!m.doc_lens.empty()) {
    int64_t sum = 0;
    for (int64_t n : m.doc_lens)
      if (__builtin_add_overflow(sum, n, &sum)) return bad("doc_lens", "the document lengths overflow 64 bits");
    if (sum != L)
      return bad("doc_lens", "document lengths sum to " + std::to_string(sum) + " but the sequence length is " +
                                 std::to_string(L));
  }
  const int64_t n = L / m.mask_block + (L % m.mask_block != 0);
  if (!m.block_mask.empty() && static_cast<int64_t>(m.block_mask.size()) != n * n)
    return bad("block_mask", "expected " + std::to_string(n) + " x " + std::to_string(n) +
                                 " entries (sequence length " + std::to_string(L) + ", mask_block " +
                                 std::to_string(m.mask_block) + "), got " + std::to_string(m.block_mask.size()));
  return ok();
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
  if (!m.doc_lens.empty()) mask.set_documents(m.doc_lens);
  const int64_t n = L / m.mask_block + (L % m.mask_block != 0);
  if (!m.block_mask.empty()) mask.set_block_mask(m.block_mask, n, m.mask_block);
  if (m.has_bigbird()) {
    mask.set_block_mask(bigbird_block_mask(n, std::min(m.bigbird_global, n), std::min(m.bigbird_window, n),
                                           std::min(m.bigbird_random, n), m.bigbird_seed),
                        n, m.mask_block);
    mask.block_mask_origin = "bigbird";
  }
  return mask;
}

AttentionSpec attention_spec(const Mask& mask, LayoutKind layout, Schedule schedule, double softmax_scale,
                             int ulysses) {
  AttentionSpec spec;
  spec.mask.causal = mask.causal;
  spec.mask.window_left = mask.window_left;
  spec.mask.window_right = mask.window_right;
  const std::vector<int64_t>& offsets = mask.doc_offsets();
  for (size_t d = 1; d < offsets.size(); ++d) spec.mask.doc_lens.push_back(offsets[d] - offsets[d - 1]);
  if (mask.has_block_mask()) {
    spec.mask.block_mask = mask.block_mask();
    spec.mask.mask_block = mask.mask_block();
  }
  spec.layout = layout == LayoutKind::zigzag    ? SequenceLayout::zigzag
                : layout == LayoutKind::striped ? SequenceLayout::striped
                                                : SequenceLayout::contiguous;
  spec.schedule = schedule == Schedule::ring ? KeyValueSchedule::ring : KeyValueSchedule::direct;
  spec.softmax_scale = softmax_scale;
  spec.ulysses = ulysses;
  return spec;
}

RingOptions ring_options(const Shard& s, const AttentionSpec& spec) {
  RingOptions o;
  o.dims.batch = s.batch;
  o.dims.heads = s.heads;
  o.dims.kv_heads = s.kv_heads;
  o.dims.head_dim = s.head_dim;
  o.dims.scale = spec.softmax_scale > 0 ? static_cast<float>(spec.softmax_scale)
                                        : static_cast<float>(1.0 / std::sqrt(double(s.head_dim)));
  o.dtype = s.dtype == ElementType::bfloat16 ? DType::bf16 : DType::f32;
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
  for (int64_t n : m.doc_lens) add(n);
  add(static_cast<int64_t>(m.block_mask.size()));
  add(static_cast<int64_t>(fnv1a(m.block_mask.data(), m.block_mask.size())));
  return key;
}

}  // namespace ringattn::api
