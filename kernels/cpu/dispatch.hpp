// The per-ISA tile functions the CPU kernels run with, chosen once (see cpu_isa()).
#pragma once

#include "kernels/cpu/tile_args.hpp"

namespace ringattn::kernels::cpu {

// The widest instruction set this CPU has, or the one RINGATTN_ISA names (std::invalid_argument
// when it names one the CPU lacks).
const TileKernels& selected_tile_kernels();

}  // namespace ringattn::kernels::cpu
