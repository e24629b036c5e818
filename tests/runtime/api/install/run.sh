#!/bin/sh
# Installs the build into a prefix inside it, then configures, builds and runs (2 ranks) an
# application outside the tree that finds the package, find_package(ringattn): once as a project of
# C++ alone (FindMPI's C component is then out of reach), once as one of C and C++.
# usage: run.sh BUILD_DIR SOURCE_DIR MPIEXEC [MPIEXEC_FLAGS...]
set -eu
build=$1 source=$2 mpiexec=$3
shift 3
prefix=$build/install-test/prefix
rm -rf "$build/install-test"
cmake --install "$build" --prefix "$prefix" >/dev/null
test -f "$prefix/include/ringattn/ringattn.hpp"
for languages in CXX "C;CXX"; do
  consumer=$build/install-test/consumer-$(echo "$languages" | tr -d ';')
  cmake -S "$source/tests/runtime/api/install/consumer" -B "$consumer" -DCMAKE_PREFIX_PATH="$prefix" \
    -DCMAKE_BUILD_TYPE=Release "-DCONSUMER_LANGUAGES=$languages" >/dev/null
  cmake --build "$consumer" >/dev/null
  echo "consumer of languages $languages: built; running it on 2 ranks"
  "$mpiexec" "$@" -np 2 "$consumer/consumer"
done
