# OpenBLAS serves two purposes: the projections of the LoRA layer are plain GEMMs, and the kernel
# benchmark measures its sgemm on the same cores as the yardstick for our attention kernels.
find_path(OPENBLAS_INCLUDE_DIR NAMES cblas.h
  PATHS /usr/include/x86_64-linux-gnu/openblas-pthread /usr/include/openblas /usr/include
  PATH_SUFFIXES openblas)
find_library(OPENBLAS_LIBRARY NAMES openblas)
if(NOT OPENBLAS_INCLUDE_DIR OR NOT OPENBLAS_LIBRARY)
  message(FATAL_ERROR "OpenBLAS not found: run launch/setup.sh (Debian package libopenblas-dev)")
endif()
add_library(ringattn_openblas INTERFACE)
target_include_directories(ringattn_openblas INTERFACE ${OPENBLAS_INCLUDE_DIR})
target_link_libraries(ringattn_openblas INTERFACE ${OPENBLAS_LIBRARY})
