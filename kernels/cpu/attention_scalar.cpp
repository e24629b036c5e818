// CPU attention tiles compiled for scalar (flags set per file in kernels/CMakeLists.txt).
#define RINGATTN_ISA_SCALAR
#include "kernels/cpu/simd.hpp"
#include "kernels/cpu/tile_args.hpp"

namespace ringattn::kernels::cpu::scalar {
#include "kernels/cpu/decode_tiles.inl"
#include "kernels/cpu/attention_tiles.inl"
}  // namespace ringattn::kernels::cpu::scalar
