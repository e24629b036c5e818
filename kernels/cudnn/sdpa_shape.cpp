// The cuDNN-free half of kernels/cudnn/sdpa_engine.hpp: graph shapes and capabilities.
#include <cstdio>
#include <cstring>
#include <string>

#include "kernels/cudnn/sdpa_engine.hpp"

namespace ringattn::kernels::cudnn {

SdpaGraphShape graph_shape(const SdpaCall& call, SdpaPass pass, const AttentionDims& dims, DType dtype, int64_t q_rows,
                           int64_t k_rows, bool deterministic) {
  SdpaGraphShape g;
  g.pass = pass;
  g.dtype = dtype;
  g.batch = dims.batch * (call.ragged ? int64_t(call.segments.size()) : 1);
  g.heads = dims.heads, g.kv_heads = dims.kv_heads, g.head_dim = dims.head_dim;
  g.s_q = call.max_q_rows(), g.s_kv = call.max_k_rows();
  // A dense call's batch stride is the buffer's rows; with one batch entry (or ragged offsets)
  // it does not matter, and leaving it out lets steps of different sizes share graphs.
  const bool strided = !call.ragged && dims.batch > 1;
  g.q_rows = strided ? q_rows : 0, g.k_rows = strided ? k_rows : 0;
  g.ragged = call.ragged, g.padding = call.padding;
  g.alignment = call.alignment;
  g.right_bound = call.right_bound, g.left_bound = call.left_bound;
  g.tiles_q = call.tiles_q, g.tiles_k = call.tiles_k;
  g.scale = dims.scale;
  g.deterministic = pass == SdpaPass::backward && deterministic;
  return g;
}

size_t SdpaGraphShape::hash() const {
  uint64_t h = 1469598103934665603ull;
  auto add = [&](int64_t x) { h = (h ^ uint64_t(x)) * 1099511628211ull; };
  uint32_t scale_bits = 0;
  std::memcpy(&scale_bits, &scale, sizeof scale_bits);
  for (int64_t x : {int64_t(pass), int64_t(dtype), batch, heads, kv_heads, head_dim, s_q, s_kv, q_rows, k_rows,
                    int64_t(ragged), int64_t(padding), int64_t(alignment), right_bound, left_bound, tiles_q, tiles_k,
                    int64_t(scale_bits), int64_t(deterministic)})
    add(x);
  return size_t(h);
}

std::string SdpaGraphShape::describe() const {
  char buf[256];
  std::snprintf(buf, sizeof buf, "%s %s b%lld h%lld/%lld d%lld sq%lld skv%lld%s%s%s",
                pass == SdpaPass::forward ? "fwd" : "bwd", dtype_name(dtype), (long long)batch, (long long)heads,
                (long long)kv_heads, (long long)head_dim, (long long)s_q, (long long)s_kv, ragged ? " ragged" : "",
                padding ? " padding" : "", deterministic ? " deterministic" : "");
  std::string s = buf;
  if (right_bound >= 0 || left_bound >= 0) {
    std::snprintf(buf, sizeof buf, " band(%s, left %lld, right %lld)",
                  alignment == DiagonalAlignment::top_left ? "top-left" : "bottom-right", (long long)left_bound,
                  (long long)right_bound);
    s += buf;
  }
  if (tiles_q > 0) s += " tiles " + std::to_string(tiles_q) + "x" + std::to_string(tiles_k);
  return s;
}

SdpaCapabilities capabilities(int version, int sm_version, int64_t elements) {
  SdpaCapabilities c;
  // cudnn-frontend: "THD (ragged offset) is only supported in Hopper and above" before 9.18.1.
  c.ragged = (sm_version >= 90 || version >= 91801) && elements < (int64_t{1} << 31);
  // Block_mask: Unified SDPA from 9.14; on SM10x only from 9.26 (a masked-tile bug before).
  c.block_mask_forward = version >= kBlockMaskVersion && (sm_version < 100 || version >= 92600);
  c.block_mask_with_band = c.block_mask_forward && version >= kBlockMaskBandVersion;
  return c;
}

}  // namespace ringattn::kernels::cudnn
