// CPU attention tiles compiled for AVX-512 with the BF16 extension (Zen 4+, Sapphire Rapids+):
// the AVX-512 code plus a bf16 dot-product path for bf16 inputs.
#define RINGATTN_ISA_AVX512
#define RINGATTN_BF16_DOT
#include "kernels/cpu/simd.hpp"
#include "kernels/cpu/tile_args.hpp"

namespace ringattn::kernels::cpu::avx512bf16 {
#include "kernels/cpu/decode_tiles.inl"
#include "kernels/cpu/attention_tiles.inl"
}  // namespace ringattn::kernels::cpu::avx512bf16
