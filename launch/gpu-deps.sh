#!/usr/bin/env bash
# Packs what the lent GPU machines lack for the whole project's build into one archive, for
# launch/gpu-check.sh (RINGATTN_GPU_CHECK_DEPS=ARCHIVE) to unpack there:
#   Boost.Program_options 1.74 (the library, its CMake package files and the Boost headers it
#   includes, so that the headers match the library even where another Boost's headers are
#   installed) and OpenBLAS with its Fortran runtime.
# Those machines (Ubuntu 24.04 with CUDA, MPI, NCCL, GoogleTest and Boost's headers, no network)
# have neither libboost-program-options-dev nor OpenBLAS; this Debian 12 machine's libraries run
# there (its glibc, 2.36, is older than theirs).
#
#   launch/gpu-deps.sh [ARCHIVE]      (default .gpu-deps/deps.tar.xz; run after launch/setup.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
archive=${1:-.gpu-deps/deps.tar.xz}
arch_dir=/usr/lib/x86_64-linux-gnu
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
lib=$stage/lib/x86_64-linux-gnu
mkdir -p "$lib/cmake" "$stage/include/openblas"

# The Boost headers program_options pulls in, found by the preprocessor itself.
printf '#include <boost/program_options.hpp>\n#include <boost/any.hpp>\n' > "$stage/probe.cpp"
g++ -std=c++20 -M "$stage/probe.cpp" | tr ' \\' '\n\n' | grep '^/usr/include/boost/' | sort -u |
  while read -r h; do
    mkdir -p "$stage/include/$(dirname "${h#/usr/include/}")"
    cp "$h" "$stage/include/${h#/usr/include/}"
  done
rm "$stage/probe.cpp"
version=$(sed -n 's/^#define BOOST_LIB_VERSION "\(.*\)"/\1/p' /usr/include/boost/version.hpp | tr _ .)
for d in "Boost-$version.0" "BoostDetectToolset-$version.0.cmake" "boost_headers-$version.0" \
         "boost_program_options-$version.0"; do
  cp -a "$arch_dir/cmake/$d" "$lib/cmake/"
done
cp -a "$arch_dir"/libboost_program_options.so* "$arch_dir/libboost_program_options.a" "$lib/"

# OpenBLAS (the pthread build), named as the Debian alternatives name it, and its runtime.
cp /usr/include/x86_64-linux-gnu/openblas-pthread/*.h "$stage/include/openblas/"
cp "$(readlink -f "$arch_dir/libopenblas.so.0")" "$lib/libopenblas.so.0"
ln -s libopenblas.so.0 "$lib/libopenblas.so"
for l in $(ldd "$lib/libopenblas.so.0" | awk '/libgfortran|libquadmath/ {print $3}'); do cp "$l" "$lib/"; done

mkdir -p "$(dirname "$archive")"
tar cJf "$archive" -C "$stage" .
echo "# wrote $archive ($(du -h "$archive" | cut -f1)): Boost.Program_options $version, OpenBLAS"
