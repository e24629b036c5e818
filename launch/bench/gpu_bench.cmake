# ringattn_gpu_bench (launch/bench/gpu_bench.cpp): throughput of the CUDA kernels on one GPU, checked
# against an fp64 reference on sampled rows. Needs no MPI; launch/gpu-check.sh runs it.
add_executable(ringattn_gpu_bench ${CMAKE_CURRENT_LIST_DIR}/gpu_bench.cpp ${CMAKE_CURRENT_LIST_DIR}/../cli/statistics.cpp)
target_link_libraries(ringattn_gpu_bench PRIVATE ringattn_kernels_cuda ringattn_kernels)
target_compile_options(ringattn_gpu_bench PRIVATE -Wall -Wextra)

# ringattn_gpu_decode_bench (launch/bench/gpu_decode_bench.cpp): the CUDA decode kernel's read rate
# against the same run's device copy bandwidth, two heads checked against fp64.
add_executable(ringattn_gpu_decode_bench ${CMAKE_CURRENT_LIST_DIR}/gpu_decode_bench.cpp
  ${CMAKE_CURRENT_LIST_DIR}/../cli/statistics.cpp)
target_link_libraries(ringattn_gpu_decode_bench PRIVATE ringattn_kernels_cuda ringattn_kernels)
target_compile_options(ringattn_gpu_decode_bench PRIVATE -Wall -Wextra)
