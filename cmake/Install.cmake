# The installable library (docs/cpp.md: ringattn::ringattn): libringattn.so holds the API
# (runtime/api) and what it uses of the runtime, kernels and communicators (their static archives),
# and exports the one public header <ringattn/ringattn.hpp> and MPI. `cmake --install build --prefix P`
# installs it with a CMake package, so that find_package(ringattn) + target_link_libraries(app
# ringattn::ringattn) works, in a project of C++ alone as in one of C and C++.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

add_library(ringattn_shared SHARED ${PROJECT_SOURCE_DIR}/runtime/api/arguments.cpp
  ${PROJECT_SOURCE_DIR}/runtime/api/context.cpp)
set_target_properties(ringattn_shared PROPERTIES OUTPUT_NAME ringattn EXPORT_NAME ringattn
  VERSION ${PROJECT_VERSION} SOVERSION ${PROJECT_VERSION_MAJOR}
  LIBRARY_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/lib)
# MPI: the installed package names no MPI target of its own; ringattnConfig.cmake finds MPI through
# the language the consuming project enabled and adds it (a C++-only project has no MPI::MPI_C).
target_link_libraries(ringattn_shared
  PRIVATE ringattn_runtime -Wl,--no-undefined PUBLIC $<BUILD_INTERFACE:MPI::MPI_C>)
target_compile_options(ringattn_shared PRIVATE -Wall -Wextra)
target_include_directories(ringattn_shared INTERFACE
  $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}/include> $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)
# mpi.h would pull in the deprecated MPI C++ bindings, which want libmpi_cxx at link time.
target_compile_definitions(ringattn_shared INTERFACE OMPI_SKIP_MPICXX MPICH_SKIP_MPICXX)
target_compile_features(ringattn_shared INTERFACE cxx_std_17)

install(TARGETS ringattn_shared EXPORT ringattnTargets
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(FILES ${PROJECT_SOURCE_DIR}/include/ringattn/ringattn.hpp ${PROJECT_SOURCE_DIR}/include/ringattn/errors.hpp DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/ringattn)
install(TARGETS ringattn RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(EXPORT ringattnTargets NAMESPACE ringattn:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/ringattn)
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/ringattnConfig.cmake.in
  ${CMAKE_BINARY_DIR}/ringattnConfig.cmake INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/ringattn)
write_basic_package_version_file(${CMAKE_BINARY_DIR}/ringattnConfigVersion.cmake COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_BINARY_DIR}/ringattnConfig.cmake ${CMAKE_BINARY_DIR}/ringattnConfigVersion.cmake
  DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/ringattn)
