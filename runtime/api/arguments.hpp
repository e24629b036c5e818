// The library's argument checks, the one place where each value of a call is judged (the command
// line and the Python module call these too, and name the arguments in their own words), and what
// a call resolves to: the element type, the mask, the layout, the ring's options and the key of
// its cached plan.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "kernels/mask/mask.hpp"
#include "ringattn/ringattn.hpp"
#include "runtime/ring_attention.hpp"
#include "runtime/shard_layout.hpp"
#include "util/dtype.hpp"

namespace ringattn::api {

// The public element types and the internal one (util/dtype.hpp), mapped here only.
DType dtype_of(ElementType type);
ElementType element_type_of(DType dtype);  // fp32, bf16 or fp16 (std::invalid_argument otherwise)

// The first problem with the options of a context (backend, comm, threads, timeout, link
// emulation) on this node; empty when there is none.
std::optional<ArgumentError> check_options(const ContextOptions& options);
// The first problem with a shard's shape (not its rows: a call's agreement judges those) and
// element type on this backend; `cuda`: the CUDA kernels' head dims and element types apply,
// else the CPU kernels'.
std::optional<ArgumentError> check_shard(const Shard& shard, bool cuda);
// The first problem with the spec that needs no sequence length (mask values, scale, layout,
// schedule, ulysses >= 1).
std::optional<ArgumentError> check_spec(const AttentionSpec& spec);
// The problems that need the whole call (every rank's rows): the sequence length against the
// ranks, documents and block mask against it, and ulysses against the ranks and heads. The same
// on every rank.
std::optional<ArgumentError> check_call(const Shard& shard, const AttentionSpec& spec, int64_t seq_len, int ranks);
// The part of check_call that is the mask's: documents and block mask against the length.
std::optional<ArgumentError> check_mask_length(const MaskSpec& mask, int64_t seq_len);

// Whether a positive softmax scale survives the kernels' fp32: within its normal range (kScaleRange).
// A scale that became 0 or infinite there would turn masked (-inf) scores into NaN.
bool scale_fits_fp32(double scale);
inline constexpr const char* kScaleRange = "fp32's normal range, 1.2e-38 to 3.4e+38";

LayoutKind layout_kind(const AttentionSpec& spec);
// The mask of a checked spec over seq_len positions: the only place a MaskSpec becomes a Mask
// (BigBird's block mask is generated here).
Mask build_mask(const AttentionSpec& spec, int64_t seq_len);
// The softmax scale a spec resolves to for this head dim.
float softmax_scale(const AttentionSpec& spec, int64_t head_dim);
RingOptions ring_options(const Shard& shard, const AttentionSpec& spec);

// Everything a plan depends on but the block mask's bytes (their hash stands in): the shape,
// sequence length, mask, layout, schedule, scale and ulysses.
std::string plan_key(const Shard& shard, const AttentionSpec& spec, int64_t seq_len);
// s into dst (capacity bytes, NUL-terminated, cut to fit): an announcement's text fields.
void copy_text(char* dst, size_t capacity, const std::string& s);
uint64_t fnv1a(const void* data, size_t bytes, uint64_t h = 1469598103934665603ull);

}  // namespace ringattn::api
