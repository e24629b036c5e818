// kernels/cuda/attention_mma_backward.cu compiled as C++ for the CPU emulation (cuda_emulation.hpp is force-included).
#include "kernels/cuda/attention_mma_backward.cu"
