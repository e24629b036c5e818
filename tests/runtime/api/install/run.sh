#!/bin/sh
# Installs the build into a prefix inside it, then configures, builds and runs (2 ranks) an
# application outside the tree that finds the package: find_package(ringattn).
# usage: run.sh BUILD_DIR SOURCE_DIR MPIEXEC [MPIEXEC_FLAGS...]
set -eu
build=$1 source=$2 mpiexec=$3
shift 3
prefix=$build/install-test/prefix
rm -rf "$build/install-test"
cmake --install "$build" --prefix "$prefix" >/dev/null
cmake -S "$source/tests/runtime/api/install/consumer" -B "$build/install-test/consumer" -DCMAKE_PREFIX_PATH="$prefix" \
  -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$build/install-test/consumer" >/dev/null
test -f "$prefix/include/ringattn/ringattn.hpp"
"$mpiexec" "$@" -np 2 "$build/install-test/consumer/consumer"
