// Tensor-core forward pass (FlashAttention-2 tiling, mma.sync m16n8k16, bf16/fp16 in, fp32 out).
//
// CTA = 4 warps = a tile of 64 query rows for one (head, batch); warp w owns rows 16w..16w+15.
// The Q tile is staged in shared memory once and its A fragments kept in registers (or read from
// there per block); the visible blocks of keys (16 to 64 keys: ForwardChoice, per head dim and
// architecture) pass through two shared-memory buffers (the
// next block's K and V are copied with cp.async while this one is computed, tile_pipeline.cuh);
// S = Q K^T is computed into registers (fragments by ldmatrix, mma.cuh), masked (partial blocks
// only) and turned into P with the online softmax, and O += P V with P rounded to the input type
// (V's fragments by ldmatrix.trans). Key blocks are visited in ascending order; blocks the mask
// hides are skipped before any load (their kinds classified once per CTA, tile_pipeline.cuh).
// The incoming partial state (O, LSE) is the starting point, so the call merges into it exactly
// as attention_forward does on the CPU.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/mma.cuh"
#include "kernels/cuda/params.cuh"
#include "kernels/cuda/tensor_core_launch.cuh"
#include "kernels/cuda/tile_pipeline.cuh"
#include "kernels/mask/tile_plan.hpp"

namespace ringattn::kernels::gpu {
namespace {

constexpr int kRows = 64;  // query rows per CTA
constexpr int kThreads = 128;

// A tile shape: keys per block; whether the warps keep their Q fragments in registers for the
// whole kernel (else they read them from shared memory per block, 64 registers fewer at D = 256);
// the CTAs per multiprocessor the registers are allotted for (__launch_bounds__); the
// architecture family it is compiled for (0: every family; tensor_core_launch.cuh).
template <int D, int kKeys_, bool kQInRegisters_, int kMinBlocks_, int kArch_>
struct ForwardShape {
  static constexpr int kKeys = kKeys_;
  static constexpr bool kQInRegisters = kQInRegisters_;
  static constexpr int kMinBlocks = kMinBlocks_;
  static constexpr int kArch = kArch_;
  using Keys = KeyBlocks<D, kKeys, kThreads>;
  static constexpr size_t kMaskBytes = sizeof(RowMask) * kRows;
  // The Q tile: in its own region, or (in registers) staged in the second K buffer before the loop.
  static constexpr size_t kQBytes = kQInRegisters ? 0 : sizeof(uint16_t) * size_t(kRows) * (D + 8);
  static_assert(!kQInRegisters || kKeys >= kRows, "the Q tile is staged in a K buffer");
  __host__ __device__ static constexpr size_t shared_bytes() { return kMaskBytes + kQBytes + Keys::shared_bytes(); }
};

// The shape per head dim and architecture family, chosen by occupancy (docs/gpu.md, "The tensor-core
// kernels"): the most CTAs per multiprocessor that registers and shared memory allow without
// spills, with blocks of at least 32 keys unless smaller ones are needed to reach two CTAs (each
// block costs two barriers and a rescaling of O whatever its size); on a tie, larger blocks, then
// Q in registers.
template <int D, int Arch>
struct ForwardChoice;
template <int Arch>
struct ForwardChoice<64, Arch> {  // 168 registers, 39 KiB: 3 CTAs
  using type = ForwardShape<64, 64, true, 3, 0>;
};
template <>
struct ForwardChoice<96, 80> {  // 161 registers, 41 KiB: 3 CTAs (64 keys: 2)
  using type = ForwardShape<96, 32, false, 3, 80>;
};
template <>
struct ForwardChoice<96, 90> {  // 168 registers, 68 KiB: 3 CTAs
  using type = ForwardShape<96, 64, false, 3, 90>;
};
template <int Arch>
struct ForwardChoice<128, Arch> {  // 226-231 registers, 71 KiB: 2 CTAs (32 keys, Q in shared memory: 3)
  // The occupancy rule chose 32 keys at 3 CTAs; on an H200 64 keys at 2 CTAs ran 13-16% faster
  // (189-200 against 154-176 TFLOP/s, bf16, L 4K and 16K), as each block's fixed costs (two
  // barriers, the rescaling of O, the row maxima and sums) are spread over twice the keys.
  using type = ForwardShape<128, 64, true, 2, 0>;
};
template <>
struct ForwardChoice<256, 80> {  // 226 registers, 68 KiB: 2 CTAs (32 keys: 1)
  using type = ForwardShape<256, 16, false, 2, 80>;
};
template <>
struct ForwardChoice<256, 90> {  // 247 registers, 101 KiB: 2 CTAs
  using type = ForwardShape<256, 32, false, 2, 90>;
};

template <class T, int D, class Tiles>
__device__ __forceinline__ void forward_tile(const AttentionParams& p) {
  constexpr int kKeys = Tiles::kKeys;
  constexpr int LD = D + 8;
  constexpr int NT = kKeys / 8;  // score n-tiles per warp
  constexpr int DT = D / 8;      // output n-tiles per warp
  constexpr int KC = D / 16;     // k-chunks of the head dim
  extern __shared__ __align__(16) unsigned char smem[];
  RowMask* rmask = reinterpret_cast<RowMask*>(smem);
  unsigned char* key_smem = smem + Tiles::kMaskBytes + Tiles::kQBytes;

  // Causal: the last query tiles see the most keys; they start first (heaviest first).
  const int64_t tile = gridDim.x - 1 - blockIdx.x, h = blockIdx.y, b = blockIdx.z, kvh = int(blockIdx.y) / p.group();
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, quad_lane = lane & 3;
  const RowSpan qspan = row_span(p.q_pos, p.q_rows, kRows, tile);
  typename Tiles::Keys keys(p, qspan, b, kvh, key_smem, tid);
  if (!keys.start()) return;  // these queries see none of these keys: the state keeps what it holds

  // The Q tile: in its own region, or in the second K buffer, which the loop fills only after
  // the warps have taken their fragments (the barrier below).
  uint16_t* qs = Tiles::kQInRegisters ? keys.ks + kKeys * LD : reinterpret_cast<uint16_t*>(smem + Tiles::kMaskBytes);
  load_rows_to_shared<D>(qs, LD, kRows, p.q, b * p.q_rows + qspan.row0, qspan.count, p.heads, h, tid, kThreads);
  for (int r = tid; r < kRows; r += kThreads)
    rmask[r] = r < qspan.count ? row_mask_32(p.mask, p.q_pos[qspan.row0 + r]) : RowMask{};

  // This thread's two rows (local indices) and the incoming state for them.
  const int rows[2] = {warp * 16 + (lane >> 2), warp * 16 + (lane >> 2) + 8};
  float m[2], l[2], o[DT][4];
  bool grew[2] = {false, false};  // saw a visible key in this call; other rows keep their state bit for bit
#pragma unroll
  for (int rr = 0; rr < 2; ++rr) {
    const bool valid = rows[rr] < qspan.count;
    const float lse_in = valid ? p.lse[(b * p.heads + h) * p.q_rows + qspan.row0 + rows[rr]] : neg_inf();
    const bool seen = valid && lse_in != neg_inf();
    const ContinuedState state = continue_state(lse_in);
    m[rr] = seen ? state.m : neg_inf();
    l[rr] = seen ? state.l : 0.0f;
#pragma unroll
    for (int dt = 0; dt < DT; ++dt) o[dt][2 * rr] = o[dt][2 * rr + 1] = 0.0f;
    if (seen) {
      const float* orow = p.o + ((b * p.q_rows + qspan.row0 + rows[rr]) * p.heads + h) * D + 2 * quad_lane;
#pragma unroll
      for (int dt = 0; dt < DT; ++dt) {
        const float2 x = *reinterpret_cast<const float2*>(orow + dt * 8);
        o[dt][2 * rr] = x.x * state.l;
        o[dt][2 * rr + 1] = x.y * state.l;
      }
    }
  }
  __syncthreads();  // Q tile and row masks in shared memory

  // This thread's two rows' element masks, in registers for the whole loop.
  const RowMask row_masks[2] = {rmask[rows[0]], rmask[rows[1]]};
  uint32_t qa[Tiles::kQInRegisters ? KC : 1][4];
  if constexpr (Tiles::kQInRegisters) {
#pragma unroll
    for (int kc = 0; kc < KC; ++kc) load_a(qs, LD, warp * 16, kc * 16, lane, qa[kc]);
    __syncthreads();  // every warp has its Q fragments before the loop refills the second K buffer
  }

  const float scale_log2 = p.scale * kLog2e;
  keys.run([&](const RowSpan& kspan, TileKind kind, const uint16_t* kt, const uint16_t* vt, const int64_t* kp) {
    float s[NT][4];
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.0f;
#pragma unroll
    for (int kc = 0; kc < KC; ++kc) {
      uint32_t fa[4];
      if constexpr (Tiles::kQInRegisters) {
#pragma unroll
        for (int i = 0; i < 4; ++i) fa[i] = qa[kc][i];
      } else {
        load_a(qs, LD, warp * 16, kc * 16, lane, fa);
      }
#pragma unroll
      for (int nt = 0; nt < NT; nt += 2) {
        uint32_t bk0[2], bk1[2];
        load_b_transposed_pair(kt, LD, nt * 8, kc * 16, lane, bk0, bk1);
        MmaElement<T>::mma(s[nt], fa, bk0);
        MmaElement<T>::mma(s[nt + 1], fa, bk1);
      }
    }

    // Keys past the block's end, and hidden keys of partial blocks, at -inf; full blocks (the
    // most) skip the per-element tests (a uniform branch). Scores stay unscaled: the scale (> 0,
    // checked at the API) is applied to the row maximum and to each score in the exponent below.
    if (kind == TileKind::partial || kspan.count < kKeys) {
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int col = nt * 8 + 2 * quad_lane + (e & 1);
          bool ok = col < kspan.count;
          if (ok && kind == TileKind::partial) ok = row_sees_32(p.mask, row_masks[e >> 1], kp[col]);
          if (!ok) s[nt][e] = neg_inf();
        }
    }
    float mx[2] = {neg_inf(), neg_inf()};
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) mx[e >> 1] = fmaxf(mx[e >> 1], s[nt][e]);
    float alpha[2], m_safe[2], sum[2] = {0.0f, 0.0f};
#pragma unroll
    for (int rr = 0; rr < 2; ++rr) {
      const float row_max = quad_max(mx[rr]) * scale_log2;  // in log2 units
      grew[rr] = grew[rr] || row_max != neg_inf();
      const float m_new = fmaxf(m[rr], row_max);
      // A row that has seen only masked keys keeps m = -inf; a finite stand-in keeps exp2 at 0, not NaN.
      m_safe[rr] = m_new == neg_inf() ? 0.0f : m_new;
      alpha[rr] = exp2_approx(m[rr] - m_safe[rr]);
      m[rr] = m_new;
    }
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        // The scaled score rounded before the subtraction (__fmul_rn: nvcc would fuse the two
        // into one FFMA): the row's maximum then gives exactly 2^0 = 1, as m was rounded the same
        // way. Fused, the maximum's p is 2^(rounding error of m), up to 1 + 4e-4 at scores of 1e4,
        // which its bf16 copy in P V loses but l keeps (HugeScoresStayFinite failed on an H200).
        s[nt][e] = exp2_approx(__fmul_rn(s[nt][e], scale_log2) - m_safe[e >> 1]);
        sum[e >> 1] += s[nt][e];
      }
#pragma unroll
    for (int rr = 0; rr < 2; ++rr) l[rr] = l[rr] * alpha[rr] + quad_sum(sum[rr]);
#pragma unroll
    for (int dt = 0; dt < DT; ++dt) {
      o[dt][0] *= alpha[0];
      o[dt][1] *= alpha[0];
      o[dt][2] *= alpha[1];
      o[dt][3] *= alpha[1];
    }

    // O += P V, P as the A operand straight from the score registers.
    accumulate_product<T, kKeys / 16, DT>(s, vt, LD, lane, o);
  });

#pragma unroll
  for (int rr = 0; rr < 2; ++rr) {
    if (rows[rr] >= qspan.count || !grew[rr]) continue;
    const bool seen = l[rr] > 0.0f;
    const float inv = seen ? __fdividef(1.0f, l[rr]) : 0.0f;  // l >= 1: no IEEE slow path needed
    float* orow = p.o + ((b * p.q_rows + qspan.row0 + rows[rr]) * p.heads + h) * D + 2 * quad_lane;
#pragma unroll
    for (int dt = 0; dt < DT; ++dt)
      *reinterpret_cast<float2*>(orow + dt * 8) = make_float2(o[dt][2 * rr] * inv, o[dt][2 * rr + 1] * inv);
    if (quad_lane == 0)
      p.lse[(b * p.heads + h) * p.q_rows + qspan.row0 + rows[rr]] = seen ? lse_of(m[rr], l[rr]) : neg_inf();
  }
}

template <class T, int D, class Shape>
__global__ void __launch_bounds__(kThreads, Shape::kMinBlocks) forward_kernel(AttentionParams p) {
  if constexpr (compiled_here<Shape>) forward_tile<T, D, Shape>(p);
}

template <class T, int D, class Shape>
void launch(TypeTag<T>, HeadDim<D>, TypeTag<Shape>, const AttentionParams& p, cudaStream_t stream) {
  const int64_t tiles = tile_count(p.q_rows, kRows);
  check_grid(tiles, p.heads, p.batch, "cuda_attention_forward");
  launch_with_shared_memory(forward_kernel<T, D, Shape>, dim3(unsigned(tiles), unsigned(p.heads), unsigned(p.batch)),
                            kThreads, Shape::shared_bytes(), stream, p);
}

}  // namespace

void forward_tensor_core(const AttentionParams& p, cudaStream_t stream) {
  launch_for_arch<ForwardChoice>(p, [&](auto... instance) { launch(instance..., p, stream); });
}

}  // namespace ringattn::kernels::gpu
