// The API's argument checks and what a call resolves to: the mask, the layout, the ring's
// options, and the key of its cached plan (runtime/api/context.cpp).
#pragma once

#include <cstdint>
#include <string>

#include "ringattn/ringattn.hpp"
#include "kernels/mask/mask.hpp"
#include "runtime/ring_attention.hpp"
#include "runtime/shard_layout.hpp"

namespace ringattn::api {

// The first local problem with the shard's shapes or the spec (what needs no sequence length),
// as an ArgumentError naming the argument; empty argument() when there is none.
// `cuda`: the head dims of the CUDA kernels apply, else the CPU kernels'.
ArgumentError check_local(const Shard& shard, const AttentionSpec& spec, bool cuda);
// The problems that need the sequence length (documents, block mask): the same on every rank.
ArgumentError check_with_length(const AttentionSpec& spec, int64_t seq_len);
// Whether a positive softmax scale survives the kernels' fp32: within its normal range (kScaleRange).
// A scale that became 0 or infinite there would turn masked (-inf) scores into NaN.
bool scale_fits_fp32(double scale);
inline constexpr const char* kScaleRange = "fp32's normal range, 1.2e-38 to 3.4e+38";

LayoutKind layout_kind(const AttentionSpec& spec);
Mask build_mask(const AttentionSpec& spec, int64_t seq_len);
RingOptions ring_options(const Shard& shard, const AttentionSpec& spec);

// The spec of an attention as the program's jobs hold it (a built Mask, BigBird's block mask
// generated, the layout resolved): what build_mask, layout_kind and ring_options turn back into it.
AttentionSpec attention_spec(const Mask& mask, LayoutKind layout, Schedule schedule, double softmax_scale,
                             int ulysses);

// Everything a plan depends on but the block mask's bytes (their hash stands in): the shape,
// sequence length, mask, layout, schedule and scale.
std::string plan_key(const Shard& shard, const AttentionSpec& spec, int64_t seq_len);
uint64_t fnv1a(const void* data, size_t bytes, uint64_t h = 1469598103934665603ull);

}  // namespace ringattn::api
