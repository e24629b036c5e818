// kernels/cuda/sdpa_glue.cu compiled as C++ for the CPU emulation (cuda_emulation.hpp is force-included).
#include "kernels/cuda/sdpa_glue.cu"
