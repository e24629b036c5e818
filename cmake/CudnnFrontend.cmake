# cuDNN's fused attention for the CUDA backend (kernels/cudnn/sdpa_engine.hpp): target
# ringattn_cudnn. It needs cudnn-frontend's headers (launch/setup.sh unpacks them from the PyPI wheel
# into build/third_party/cudnn-frontend; or -DCUDNN_FRONTEND_INCLUDE_DIR=...) and cudnn.h (the CUDA
# toolkit's, or -DCUDNN_INCLUDE_DIR=..., e.g. PyTorch's nvidia/cudnn/include). libcudnn itself is
# loaded when the program runs (cudnn-frontend's dynamic loading), so the build never links it and a
# machine without it runs our kernels. Without the headers the engine reports that it was not built.
find_path(CUDNN_FRONTEND_INCLUDE_DIR NAMES cudnn_frontend.h
  HINTS ${PROJECT_SOURCE_DIR}/build/third_party/cudnn-frontend/include
        ${CMAKE_BINARY_DIR}/third_party/cudnn-frontend/include $ENV{CUDNN_FRONTEND_DIR}/include
  NO_DEFAULT_PATH)
find_path(CUDNN_INCLUDE_DIR NAMES cudnn.h
  HINTS ${CUDAToolkit_INCLUDE_DIRS} $ENV{CUDNN_HOME}/include $ENV{CUDNN_PATH}/include /usr/local/include /usr/include)
if(CUDNN_FRONTEND_INCLUDE_DIR AND CUDNN_INCLUDE_DIR)
  file(STRINGS ${CUDNN_FRONTEND_INCLUDE_DIR}/cudnn_frontend_version.h fe_version REGEX "define CUDNN_FRONTEND_(MAJOR|MINOR|PATCH)_VERSION ")
  string(REGEX REPLACE "[^0-9;]" "" fe_version "${fe_version}")
  string(REPLACE ";" "." fe_version "${fe_version}")
  message(STATUS "ringattn: cuDNN path built: cudnn-frontend ${fe_version} (${CUDNN_FRONTEND_INCLUDE_DIR}), cudnn.h from ${CUDNN_INCLUDE_DIR}")
  add_library(ringattn_cudnn STATIC ${PROJECT_SOURCE_DIR}/kernels/cudnn/cudnn_engine.cpp)
  # The frontend's own include order and warnings are not ours to fix.
  target_include_directories(ringattn_cudnn SYSTEM PRIVATE ${CUDNN_FRONTEND_INCLUDE_DIR} ${CUDNN_INCLUDE_DIR})
  target_compile_definitions(ringattn_cudnn PRIVATE NV_CUDNN_FRONTEND_USE_DYNAMIC_LOADING)
  target_compile_options(ringattn_cudnn PRIVATE -Wall -Wextra)
  target_link_libraries(ringattn_cudnn PUBLIC ringattn_kernels CUDA::cudart ${CMAKE_DL_LIBS})
  set(RINGATTN_CUDNN_FRONTEND ON)
else()
  message(STATUS "ringattn: cudnn-frontend headers or cudnn.h not found (run launch/setup.sh): the CUDA backend "
                 "runs our kernels only")
  add_library(ringattn_cudnn STATIC ${PROJECT_SOURCE_DIR}/kernels/cudnn/no_cudnn_engine.cpp)
  target_link_libraries(ringattn_cudnn PUBLIC ringattn_kernels)
  set(RINGATTN_CUDNN_FRONTEND OFF)
endif()
set(RINGATTN_CUDNN_FRONTEND ${RINGATTN_CUDNN_FRONTEND} PARENT_SCOPE)
