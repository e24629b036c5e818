# -DRINGATTN_GPU_CHECK_ONLY=ON: what a bare GPU machine can build (launch/gpu-check.sh there):
# the CPU and CUDA kernels, their tests (GoogleTest if found, else a small stand-in) and the GPU
# benchmark. No MPI, Boost, OpenBLAS or NCCL; included from the top CMakeLists.txt, which then
# stops.
include(CheckLanguage)
check_language(CUDA)
if(NOT CMAKE_CUDA_COMPILER)
  message(FATAL_ERROR "RINGATTN_GPU_CHECK_ONLY needs a CUDA compiler (nvcc)")
endif()
if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
  set(CMAKE_CUDA_ARCHITECTURES 80 90)
endif()
enable_language(CUDA)
find_package(CUDAToolkit REQUIRED)
find_package(OpenMP REQUIRED COMPONENTS CXX)
find_package(Threads REQUIRED)
find_package(GTest QUIET)
if(GTest_FOUND)
  include(GoogleTest)
endif()
set(RINGATTN_HAVE_CUDA ON)
message(STATUS "ringattn: GPU check build (kernels, their tests, the GPU benchmark); GoogleTest ${GTest_FOUND}")

add_subdirectory(util)
add_subdirectory(kernels)
set(RINGATTN_CUDA_TEST_LIBS ringattn_kernels)
enable_testing()
add_subdirectory(tests/kernels)
include(launch/bench/gpu_bench.cmake)
