// CPU attention on Intel AMX (Sapphire Rapids and later): bf16 inputs take the tile matrix unit
// for every product, S = Q K^T and O += P V in the forward, the five products of the backward, in
// fp32 sums; the online softmax, its rescaling and the masks stay on AVX-512 (attention_tiles_amx.inl).
// fp32 inputs and the decode kernel run the AVX-512 code, compiled here again (namespace amx), so
// that one table serves a call of either type. Compiled with -mamx-tile -mamx-bf16 and the
// AVX-512 flags (kernels/CMakeLists.txt); dispatch.cpp picks it where CPUID has AMX-BF16 and the
// kernel grants the tile state (arch_prctl(ARCH_REQ_XCOMP_PERM)).
#define RINGATTN_ISA_AVX512
#define RINGATTN_AMX
#include "kernels/cpu/simd.hpp"
#include "kernels/cpu/tile_args.hpp"

namespace ringattn::kernels::cpu::amx {
#include "kernels/cpu/decode_tiles.inl"
#include "kernels/cpu/attention_tiles.inl"

namespace {

// The tile registers as every product here uses them: tiles 0-3 accumulate a 2 x 2 block of C
// (16 x 16 fp32 each), 4-5 hold two row tiles of A (16 rows x kchunk bf16), 6-7 two column tiles of
// B (kchunk/2 rows of 16 bf16 pairs: the VNNI layout, B[k/2][n] = (B[k][n], B[k+1][n])).
// kchunk, the inner dimension per instruction, is 32 (a whole 64-byte row), or 16 where the head
// dim is an odd multiple of 16: one configuration per call, as loading one zeroes every tile.
struct alignas(64) TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// Keys per block of the AMX forward: twice the AVX-512 forward's, which halves the loads and
// stores of O^T (the C of O^T += V^T P^T) per key.
constexpr int BCA = 128;

inline int inner_chunk(int head_dim) { return head_dim % 32 == 0 ? 32 : 16; }

inline void configure_tiles(int kchunk) {
  TileConfig c;
  for (int t = 0; t < 8; ++t) {
    c.colsb[t] = uint16_t(t >= 4 && t < 6 ? 2 * kchunk : 64);
    c.rows[t] = uint8_t(t >= 6 ? kchunk / 2 : 16);
  }
  // (GCC's tile intrinsics tell the compiler of no memory they read: the barriers keep the vector
  // stores that fill an operand before the tile load that reads it.)
  __asm__ volatile("" ::: "memory");
  _tile_loadconfig(&c);
}

// One operand of a product, in bytes: the tile of row (or column) tile t and inner chunk k starts
// at base + t * tile_step + k * chunk_step, its rows `stride` apart.
struct Operand {
  const void* base;
  int64_t stride, tile_step, chunk_step;
  const char* at(int t, int k) const { return static_cast<const char*>(base) + t * tile_step + k * chunk_step; }
};
// A row-major bf16 matrix [M][K] (row stride `stride` bytes) as the A operand.
inline Operand rows_operand(const void* base, int64_t stride, int kchunk) {
  return {base, stride, 16 * stride, 2 * int64_t(kchunk)};
}
// A matrix of bf16 pairs [K/2][N] (row stride `stride` bytes) as the B operand.
inline Operand pairs_operand(const void* base, int64_t stride, int kchunk) {
  return {base, stride, 64, int64_t(kchunk / 2) * stride};
}

// C tiles (mt .. mt+MT) x (nt .. nt+NT) of an fp32 matrix (row stride ldc bytes), from zero or
// from C, plus the sum over `chunks` inner chunks of A B.
template <int MT, int NT>
inline void tile_block(float* c, int64_t ldc, int mt, int nt, const Operand& a, const Operand& b, int chunks,
                       bool load_c) {
  char* c0 = reinterpret_cast<char*>(c) + mt * 16 * ldc + nt * 64;
  char* c1 = c0 + 16 * ldc;
  if (load_c) {
    _tile_loadd(0, c0, ldc);
    if constexpr (NT == 2) _tile_loadd(1, c0 + 64, ldc);
    if constexpr (MT == 2) _tile_loadd(2, c1, ldc);
    if constexpr (MT == 2 && NT == 2) _tile_loadd(3, c1 + 64, ldc);
  } else {
    _tile_zero(0);
    if constexpr (NT == 2) _tile_zero(1);
    if constexpr (MT == 2) _tile_zero(2);
    if constexpr (MT == 2 && NT == 2) _tile_zero(3);
  }
  for (int k = 0; k < chunks; ++k) {
    _tile_loadd(4, a.at(mt, k), a.stride);
    _tile_loadd(6, b.at(nt, k), b.stride);
    _tile_dpbf16ps(0, 4, 6);
    if constexpr (NT == 2) {
      _tile_loadd(7, b.at(nt + 1, k), b.stride);
      _tile_dpbf16ps(1, 4, 7);
    }
    if constexpr (MT == 2) {
      _tile_loadd(5, a.at(mt + 1, k), a.stride);
      _tile_dpbf16ps(2, 5, 6);
    }
    if constexpr (MT == 2 && NT == 2) _tile_dpbf16ps(3, 5, 7);
  }
  _tile_stored(0, c0, ldc);
  if constexpr (NT == 2) _tile_stored(1, c0 + 64, ldc);
  if constexpr (MT == 2) _tile_stored(2, c1, ldc);
  if constexpr (MT == 2 && NT == 2) _tile_stored(3, c1 + 64, ldc);
}

// C (+)= A B for an fp32 C of mtiles x ntiles tiles (row stride ldc bytes), the inner dimension in
// `chunks` chunks: 2 x 2 blocks of tiles (each A and B tile loaded serves two products), and a
// one-tile edge where a count is odd. C in fp32 throughout: from zero (load_c false) or onto C.
inline void tile_product(float* c, int64_t ldc, int mtiles, int ntiles, const Operand& a, const Operand& b, int chunks,
                         bool load_c) {
  __asm__ volatile("" ::: "memory");
  for (int mt = 0; mt < mtiles; mt += 2)
    for (int nt = 0; nt < ntiles; nt += 2) {
      const bool m2 = mt + 1 < mtiles, n2 = nt + 1 < ntiles;
      if (m2 && n2)
        tile_block<2, 2>(c, ldc, mt, nt, a, b, chunks, load_c);
      else if (m2)
        tile_block<2, 1>(c, ldc, mt, nt, a, b, chunks, load_c);
      else if (n2)
        tile_block<1, 2>(c, ldc, mt, nt, a, b, chunks, load_c);
      else
        tile_block<1, 1>(c, ldc, mt, nt, a, b, chunks, load_c);
    }
}

// Two vectors of fp32 (lanes i of lo and hi) rounded to bf16 (nearest even) and interleaved:
// lane i holds lo[i] in its low half and hi[i] in its high half, the pair layout of B.
inline __m512i bf16_pairs(V lo, V hi) {
  const __m512i idx = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22, 6,
                                       21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
  return _mm512_permutexvar_epi16(idx, (__m512i)_mm512_cvtne2ps_pbh(hi, lo));
}
// The same two vectors as two rows of 16 bf16 each, at p and p + row.
inline void store_bf16_rows(bf16_bits* p, int64_t row, V lo, V hi) {
  const __m512i both = (__m512i)_mm512_cvtne2ps_pbh(hi, lo);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_castsi512_si256(both));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p + row), _mm512_extracti64x4_epi64(both, 1));
}

// rows [n, n_pad) of an [n_pad][cols] bf16 copy of src's first n rows are zero.
inline void padded_rows(const bf16_bits* src, int64_t stride, int n, int n_pad, int cols, bf16_bits* dst) {
  for (int j = 0; j < n_pad; ++j)
    for (int d = 0; d < cols; ++d) dst[j * cols + d] = j < n ? src[j * stride + d] : bf16_bits{0};
}

#include "kernels/cpu/attention_tiles_amx.inl"

// The matrix unit's peak on one core: four independent accumulator tiles, each instruction a
// 16 x 16 x 32 product (16384 FLOPs), from registers (no loads: the unit's own rate).
float tile_loop(int64_t iters, float seed) {
  configure_tiles(32);
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  _tile_zero(4);
  _tile_zero(5);
  _tile_zero(6);
  _tile_zero(7);
  for (int64_t it = 0; it < iters; ++it) {
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
  }
  alignas(64) float c[16 * 16];
  _tile_stored(0, c, 64);
  _tile_release();
  return c[0] + seed;
}
constexpr int kTileLoopFlops = 4 * 16 * 16 * 32 * 2;

// bf16 inputs on the tiles, fp32 on the AVX-512 code of this translation unit.
void forward_tile_amx(const ForwardTileArgs& a) {
  if (a.vt16)
    amx_forward_tile(a);
  else
    forward_tile(a);
}
void backward_block_amx(const BackwardBlockArgs& a) {
  if (a.k16)
    amx_backward_block(a);
  else
    backward_block(a);
}

}  // namespace

TileKernels tile_kernels() {
  TileKernels t = fma_tile_kernels();
  t.forward_tile = &forward_tile_amx;
  t.backward_block = &backward_block_amx;
  t.amx = true;
  t.amx_key_block = BCA;
  t.tile_loop = &tile_loop;
  t.tile_flops_per_iter = kTileLoopFlops;
  return t;
}

}  // namespace ringattn::kernels::cpu::amx
