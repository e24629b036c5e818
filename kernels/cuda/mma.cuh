// Warp-level tensor-core tiles: mma.sync.m16n8k16 with bf16 or fp16 inputs and fp32
// accumulators (sm_80+), and the fragment loads from shared memory that the attention kernels
// need. Fragment layouts are those of the PTX ISA ("Matrix Fragments for mma.m16n8k16"); with
// lane = 4 * group + quad_lane (group = lane / 4, quad_lane = lane % 4):
//   A (16 x 16, row-major):  a[0] = A[group][2q, 2q+1]      a[1] = A[group + 8][2q, 2q+1]
//                            a[2] = A[group][2q+8, 2q+9]    a[3] = A[group + 8][2q+8, 2q+9]
//   B (16 x 8, k x n):       b[0] = B[2q, 2q+1][group]      b[1] = B[2q+8, 2q+9][group]
//   C (16 x 8, fp32):        c[0], c[1] = C[group][2q, 2q+1]  c[2], c[3] = C[group + 8][2q, 2q+1]
// (two 16-bit elements per 32-bit register, the lower index in the low half). The C layout of
// two neighbouring n-tiles is the A layout of one 16 x 16 tile, so a score tile turns into the
// left operand of the next product without leaving registers (FlashAttention-2).
//
// Shared-memory tiles hold 16-bit elements, row-major with a row stride `ld` (in elements);
// ld = D + 8 keeps the fragment loads free of bank conflicts.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <cstring>

namespace ringattn::kernels::gpu {

template <class T>
struct MmaElement;

template <>
struct MmaElement<__nv_bfloat16> {
  static __device__ __forceinline__ uint32_t pack(float lo, float hi) {
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);  // .x (low half) = lo
    uint32_t bits;
    memcpy(&bits, &v, sizeof bits);
    return bits;
  }
  // d += a * b
  static __device__ __forceinline__ void mma(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
#if defined(RINGATTN_CUDA_EMULATION)
    ::cuda_emulation::mma_m16n8k16(d, a, b, ::cuda_emulation::MmaInput::bf16);
#else
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#endif
  }
};

template <>
struct MmaElement<__half> {
  static __device__ __forceinline__ uint32_t pack(float lo, float hi) {
    const __half2 v = __floats2half2_rn(lo, hi);
    uint32_t bits;
    memcpy(&bits, &v, sizeof bits);
    return bits;
  }
  static __device__ __forceinline__ void mma(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
#if defined(RINGATTN_CUDA_EMULATION)
    ::cuda_emulation::mma_m16n8k16(d, a, b, ::cuda_emulation::MmaInput::f16);
#else
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#endif
  }
};

__device__ __forceinline__ uint32_t load_pair(const uint16_t* s) { return *reinterpret_cast<const uint32_t*>(s); }
__device__ __forceinline__ uint32_t pack_halves(uint16_t lo, uint16_t hi) {
  return uint32_t(lo) | (uint32_t(hi) << 16);
}

// A = rows [row0, row0 + 16) x columns [col0, col0 + 16) of a row-major tile.
__device__ __forceinline__ void load_a(const uint16_t* s, int ld, int row0, int col0, int lane, uint32_t (&a)[4]) {
  const int g = lane >> 2, q = lane & 3;
  const uint16_t* p = s + (row0 + g) * ld + col0 + 2 * q;
  a[0] = load_pair(p);
  a[1] = load_pair(p + 8 * ld);
  a[2] = load_pair(p + 8);
  a[3] = load_pair(p + 8 * ld + 8);
}

// B[k][n] = s[(n0 + n) * ld + k0 + k]: the tile's rows are B's columns (K in S = Q K^T).
__device__ __forceinline__ void load_b_transposed(const uint16_t* s, int ld, int n0, int k0, int lane,
                                                  uint32_t (&b)[2]) {
  const int g = lane >> 2, q = lane & 3;
  const uint16_t* p = s + (n0 + g) * ld + k0 + 2 * q;
  b[0] = load_pair(p);
  b[1] = load_pair(p + 8);
}

// B[k][n] = s[(k0 + k) * ld + n0 + n]: the tile's rows are B's rows (V in O = P V).
__device__ __forceinline__ void load_b(const uint16_t* s, int ld, int k0, int n0, int lane, uint32_t (&b)[2]) {
  const int g = lane >> 2, q = lane & 3;
  const uint16_t* p = s + (k0 + 2 * q) * ld + n0 + g;
  b[0] = pack_halves(p[0], p[ld]);
  b[1] = pack_halves(p[8 * ld], p[9 * ld]);
}

// The A fragment (16 x 16) made of accumulator n-tiles c0 (columns 0..7) and c1 (8..15), rounded to T.
template <class T>
__device__ __forceinline__ void accumulators_to_a(const float (&c0)[4], const float (&c1)[4], uint32_t (&a)[4]) {
  a[0] = MmaElement<T>::pack(c0[0], c0[1]);
  a[1] = MmaElement<T>::pack(c0[2], c0[3]);
  a[2] = MmaElement<T>::pack(c1[0], c1[1]);
  a[3] = MmaElement<T>::pack(c1[2], c1[3]);
}

// Warp tile products used by every tensor-core kernel (KC k-chunks of 16, NT or DT n-tiles of 8).

// c[nt] = A B^T for the warp's 16 rows of `a` (from row0) against rows nt*8.. of `b`, both
// row-major tiles of 16 * KC columns (S = Q K^T, dP = dO V^T, and their transposes).
template <class T, int NT, int KC>
__device__ __forceinline__ void product_transposed(const uint16_t* a, const uint16_t* b, int ld, int row0, int lane,
                                                   float (&c)[NT][4]) {
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) c[nt][0] = c[nt][1] = c[nt][2] = c[nt][3] = 0.0f;
#pragma unroll
  for (int kc = 0; kc < KC; ++kc) {
    uint32_t fa[4];
    load_a(a, ld, row0, kc * 16, lane, fa);
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      uint32_t fb[2];
      load_b_transposed(b, ld, nt * 8, kc * 16, lane, fb);
      MmaElement<T>::mma(c[nt], fa, fb);
    }
  }
}

// out[dt] += P B: P is the warp's accumulator tiles (16 rows x 16 * KC columns, rounded to T),
// B the row-major tile whose row k matches P's column k (O += P V, dQ += dS K, dV += P^T dO, ...).
template <class T, int KC, int DT>
__device__ __forceinline__ void accumulate_product(const float (&pt)[2 * KC][4], const uint16_t* b, int ld, int lane,
                                                   float (&out)[DT][4]) {
#pragma unroll
  for (int kc = 0; kc < KC; ++kc) {
    uint32_t fa[4];
    accumulators_to_a<T>(pt[2 * kc], pt[2 * kc + 1], fa);
#pragma unroll
    for (int dt = 0; dt < DT; ++dt) {
      uint32_t fb[2];
      load_b(b, ld, kc * 16, dt * 8, lane, fb);
      MmaElement<T>::mma(out[dt], fa, fb);
    }
  }
}

// Max and sum over the four lanes that share an accumulator row.
__device__ __forceinline__ float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
__device__ __forceinline__ float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

// Copies rows [row0, row0 + count) of head `head` from a (batch, rows, heads, D) tensor into a
// shared tile of `tile_rows` rows (stride ld), zero past `count`. 16-byte chunks; T is 2 bytes.
template <int D>
__device__ __forceinline__ void load_rows_to_shared(uint16_t* s, int ld, int tile_rows, const void* g,
                                                    int64_t batch_row0, int64_t count, int64_t heads, int64_t head,
                                                    int tid, int threads) {
  constexpr int kChunks = D / 8;
  const uint16_t* src = static_cast<const uint16_t*>(g);
  for (int c = tid; c < tile_rows * kChunks; c += threads) {
    const int r = c / kChunks, col = (c % kChunks) * 8;
    uint4 v = make_uint4(0, 0, 0, 0);
    if (r < count) v = *reinterpret_cast<const uint4*>(src + ((batch_row0 + r) * heads + head) * D + col);
    *reinterpret_cast<uint4*>(s + r * ld + col) = v;
  }
}

// Asynchronous copies global -> shared (cp.async, sm_80+), so that the next tile's loads overlap
// this tile's arithmetic: issue, commit them as a group, later wait until at most N groups are
// in flight, then __syncthreads before reading what other threads copied.
__device__ __forceinline__ void copy_async_16(void* shared_dst, const void* global_src) {
#if defined(RINGATTN_CUDA_EMULATION)
  ::cuda_emulation::async_copy(shared_dst, global_src, 16);
#else
  const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(shared_dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(global_src));
#endif
}

__device__ __forceinline__ void copy_async_commit() {
#if defined(RINGATTN_CUDA_EMULATION)
  ::cuda_emulation::async_commit();
#else
  asm volatile("cp.async.commit_group;\n" ::);
#endif
}

template <int N>
__device__ __forceinline__ void copy_async_wait() {
#if defined(RINGATTN_CUDA_EMULATION)
  ::cuda_emulation::async_wait(N);
#else
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
#endif
}

// load_rows_to_shared with cp.async for the rows that exist (zeros stored directly past `count`).
template <int D>
__device__ __forceinline__ void load_rows_to_shared_async(uint16_t* s, int ld, int tile_rows, const void* g,
                                                          int64_t batch_row0, int64_t count, int64_t heads,
                                                          int64_t head, int tid, int threads) {
  constexpr int kChunks = D / 8;
  const uint16_t* src = static_cast<const uint16_t*>(g);
  for (int c = tid; c < tile_rows * kChunks; c += threads) {
    const int r = c / kChunks, col = (c % kChunks) * 8;
    if (r < count)
      copy_async_16(s + r * ld + col, src + ((batch_row0 + r) * heads + head) * D + col);
    else
      *reinterpret_cast<uint4*>(s + r * ld + col) = make_uint4(0, 0, 0, 0);
  }
}

}  // namespace ringattn::kernels::gpu
