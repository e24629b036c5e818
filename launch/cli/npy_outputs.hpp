// Output .npy files that every rank fills with its own rows and that appear at their final paths
// only when every rank has written (NpyOutput), shared by `ringattn attention` and `ringattn layer`.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "comm/communicator.hpp"
#include "runtime/io/npy.hpp"

namespace ringattn {

struct OutputRows {
  std::string path;
  std::string label;            // names the output in messages
  std::vector<int64_t> shape;   // of the whole file
  RowSelection rows;            // this rank's part (its positions must outlive write_outputs)
  const float* data = nullptr;  // laid out as `rows` says
};

// Writes every file in agreed phases (collective, same list on every rank): rank 0 creates them,
// every rank writes its rows and flushes, then rank 0 renames them into place. A failure on any
// rank ends every rank with JobFailed and leaves no file at a final path. `after_write` runs on
// every rank once its rows are on disk, before the renames (the tests' hook, launch/test_hook).
void write_outputs(comm::Communicator& comm, const std::vector<OutputRows>& files,
                   const std::function<void()>& after_write = {});

}  // namespace ringattn
