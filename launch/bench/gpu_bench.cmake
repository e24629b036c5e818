# ringattn_gpu_bench (launch/bench/gpu_bench.cpp): throughput of the CUDA kernels on one GPU, checked
# against an fp64 reference on sampled rows. Needs no MPI; launch/gpu-check.sh runs it.
add_executable(ringattn_gpu_bench ${CMAKE_CURRENT_LIST_DIR}/gpu_bench.cpp ${CMAKE_CURRENT_LIST_DIR}/../cli/statistics.cpp)
target_link_libraries(ringattn_gpu_bench PRIVATE ringattn_kernels_cuda ringattn_kernels)
target_compile_options(ringattn_gpu_bench PRIVATE -Wall -Wextra)
