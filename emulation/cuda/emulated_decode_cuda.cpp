// kernels/cuda/decode_cuda.cu compiled as C++ for the CPU emulation (cuda_emulation.hpp is force-included).
#include "kernels/cuda/decode_cuda.cu"
