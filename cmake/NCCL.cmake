# Finds NCCL headers and library (shipped with the CUDA toolkit here, or from a system package).
find_path(NCCL_INCLUDE_DIR NAMES nccl.h
  HINTS ${CUDAToolkit_INCLUDE_DIRS} $ENV{NCCL_HOME}/include /usr/local/include /usr/include)
find_library(NCCL_LIBRARY NAMES nccl
  HINTS ${CUDAToolkit_LIBRARY_DIR} $ENV{NCCL_HOME}/lib /usr/local/lib /usr/lib/x86_64-linux-gnu)
if(NCCL_INCLUDE_DIR AND NCCL_LIBRARY)
  set(RINGATTN_NCCL_FOUND ON)
  add_library(ringattn_nccl INTERFACE)
  target_include_directories(ringattn_nccl INTERFACE ${NCCL_INCLUDE_DIR})
  target_link_libraries(ringattn_nccl INTERFACE ${NCCL_LIBRARY})
else()
  set(RINGATTN_NCCL_FOUND OFF)
endif()
