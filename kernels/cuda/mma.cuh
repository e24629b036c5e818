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
// Fragments are loaded from shared memory with ldmatrix (.trans for the operands stored k-major:
// V, dO, Q, K in the second product of each pair). Shared-memory tiles hold 16-bit elements,
// row-major with a row stride `ld` (in elements); ld = D + 8 (16 bytes of padding) puts the eight
// 16-byte rows that one ldmatrix phase reads in eight different groups of four banks, so the
// loads are free of bank conflicts for every D that is a multiple of 16.
// Requirements: NT and DT even (pairs of n-tiles per ldmatrix.x4).
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

// ldmatrix.sync.aligned.m8n8.x4[.trans].shared.b16: four 8 x 8 matrices of 16-bit elements; lane
// l gives the address of row l % 8 of matrix l / 8 (16 bytes, 16-byte aligned), and register i
// of lane t receives row t / 4, columns 2 (t % 4) and 2 (t % 4) + 1 of matrix i (with .trans,
// column t / 4 of rows 2 (t % 4) and 2 (t % 4) + 1): exactly one mma fragment register. One
// instruction replaces eight 32-bit shared loads (sixteen 16-bit ones for .trans).
template <bool Transpose>
__device__ __forceinline__ void load_matrix_x4(const uint16_t* row, uint32_t (&r)[4]) {
#if defined(RINGATTN_CUDA_EMULATION)
  ::cuda_emulation::load_matrix(r, 4, Transpose, row);
#else
  const unsigned address = static_cast<unsigned>(__cvta_generic_to_shared(row));
  if constexpr (Transpose)
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(address));
  else
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(address));
#endif
}

// A = rows [row0, row0 + 16) x columns [col0, col0 + 16) of a row-major tile. Matrices 0..3 are
// (rows 0-7, cols 0-7), (rows 8-15, cols 0-7), (rows 0-7, cols 8-15), (rows 8-15, cols 8-15).
__device__ __forceinline__ void load_a(const uint16_t* s, int ld, int row0, int col0, int lane, uint32_t (&a)[4]) {
  load_matrix_x4<false>(s + (row0 + (lane & 7) + (lane & 8)) * ld + col0 + ((lane >> 4) << 3), a);
}

// A = rows [row0, row0 + 16) x columns [col0, col0 + 16) of a tile stored transposed: A[m][k] =
// s[k * ld + m] (dS from dS^T in dQ = dS K), read with .trans. Matrices as load_a's: (m 0-7, k 0-7),
// (m 8-15, k 0-7), (m 0-7, k 8-15), (m 8-15, k 8-15), each eight stored rows k of eight m.
__device__ __forceinline__ void load_a_transposed(const uint16_t* s, int ld, int row0, int col0, int lane,
                                                  uint32_t (&a)[4]) {
  load_matrix_x4<true>(s + (col0 + (lane & 7) + ((lane >> 4) << 3)) * ld + row0 + (lane & 8), a);
}

// Two B fragments (n-tiles n0 and n0 + 8) with B[k][n] = s[(n + ..) * ld + k0 + k]: the tile's rows
// are B's columns (K in S = Q K^T). Matrices: (n 0-7, k 0-7), (n 0-7, k 8-15), then n 8-15.
__device__ __forceinline__ void load_b_transposed_pair(const uint16_t* s, int ld, int n0, int k0, int lane,
                                                       uint32_t (&b0)[2], uint32_t (&b1)[2]) {
  uint32_t r[4];
  load_matrix_x4<false>(s + (n0 + (lane & 7) + ((lane >> 4) << 3)) * ld + k0 + (lane & 8), r);
  b0[0] = r[0], b0[1] = r[1], b1[0] = r[2], b1[1] = r[3];
}

// Two B fragments (n-tiles n0 and n0 + 8) with B[k][n] = s[(k0 + k) * ld + n + ..]: the tile's rows
// are B's rows (V in O = P V), read transposed. Matrices: (k 0-7, n 0-7), (k 8-15, n 0-7), then n 8-15.
__device__ __forceinline__ void load_b_pair(const uint16_t* s, int ld, int k0, int n0, int lane, uint32_t (&b0)[2],
                                            uint32_t (&b1)[2]) {
  uint32_t r[4];
  load_matrix_x4<true>(s + (k0 + (lane & 7) + (lane & 8)) * ld + n0 + ((lane >> 4) << 3), r);
  b0[0] = r[0], b0[1] = r[1], b1[0] = r[2], b1[1] = r[3];
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
    for (int nt = 0; nt < NT; nt += 2) {
      uint32_t fb0[2], fb1[2];
      load_b_transposed_pair(b, ld, nt * 8, kc * 16, lane, fb0, fb1);
      MmaElement<T>::mma(c[nt], fa, fb0);
      MmaElement<T>::mma(c[nt + 1], fa, fb1);
    }
  }
}

// out[dt] += A B for one 16-column chunk of A (its fragment fa) and the 16 rows of B from row k0
// (row-major, stride ld): the step both products below take per chunk of A.
template <class T, int DT>
__device__ __forceinline__ void accumulate_chunk_product(const uint32_t (&fa)[4], const uint16_t* b, int ld, int k0,
                                                         int lane, float (&out)[DT][4]) {
#pragma unroll
  for (int dt = 0; dt < DT; dt += 2) {
    uint32_t fb0[2], fb1[2];
    load_b_pair(b, ld, k0, dt * 8, lane, fb0, fb1);
    MmaElement<T>::mma(out[dt], fa, fb0);
    MmaElement<T>::mma(out[dt + 1], fa, fb1);
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
    accumulate_chunk_product<T>(fa, b, ld, kc * 16, lane, out);
  }
}

// out[dt] += A B for 16 rows of A from row0, A stored transposed (a_t[k][m], row-major, stride
// lda: dS^T for dQ += dS K), B row-major with row k matching A's column k (stride ldb).
template <class T, int KC, int DT>
__device__ __forceinline__ void accumulate_transposed_product(const uint16_t* a_t, int lda, int row0,
                                                              const uint16_t* b, int ldb, int lane,
                                                              float (&out)[DT][4]) {
#pragma unroll
  for (int kc = 0; kc < KC; ++kc) {
    uint32_t fa[4];
    load_a_transposed(a_t, lda, row0, kc * 16, lane, fa);
    accumulate_chunk_product<T>(fa, b, ldb, kc * 16, lane, out);
  }
}

// Stores the warp's accumulator tiles c[nt] (16 rows x 8 * NT columns), rounded to T, into a
// row-major 16-bit tile from row0 (stride ld): each lane writes its two neighbouring columns as one
// 32-bit word, free of bank conflicts when ld is an odd multiple of 8 (rows of 16 * n elements
// padded by 16 bytes).
template <class T, int NT>
__device__ __forceinline__ void store_accumulators(const float (&c)[NT][4], uint16_t* s, int ld, int row0, int lane) {
  uint16_t* top = s + (row0 + (lane >> 2)) * ld + 2 * (lane & 3);
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
    *reinterpret_cast<uint32_t*>(top + nt * 8) = MmaElement<T>::pack(c[nt][0], c[nt][1]);
    *reinterpret_cast<uint32_t*>(top + 8 * ld + nt * 8) = MmaElement<T>::pack(c[nt][2], c[nt][3]);
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
