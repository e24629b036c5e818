// A float32 safetensors file shared by all ranks, each writing its own rows of each tensor, under a
// temporary name renamed into place only when every rank has written (as NpyOutput, npy.hpp):
//   one rank:    auto out = SafetensorsOutput::create(path, label, tensors, metadata);
//                send out.temp_path() to the others
//   other ranks: auto out = SafetensorsOutput::open(path, temp_path, label, tensors, metadata);
//   every rank:  out.write_rows(i, rows, data) for its part of tensor i; out.finish();
//   barrier (the caller's)
//   one rank:    out.commit();
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "runtime/io/npy.hpp"
#include "runtime/io/safetensors.hpp"
#include "runtime/io/temp_output.hpp"

namespace ringattn {

class SafetensorsOutput {
 public:
  using Metadata = std::vector<std::pair<std::string, std::string>>;
  // Creates `<path>.tmp-<unique>` with the header and the whole size reserved.
  static SafetensorsOutput create(const std::string& path, const std::string& label,
                                  const std::vector<SafetensorsEntry>& tensors, const Metadata& metadata);
  // Opens the temporary file another rank created, checking that its header is the one expected.
  static SafetensorsOutput open(const std::string& path, const std::string& temp_path, const std::string& label,
                                const std::vector<SafetensorsEntry>& tensors, const Metadata& metadata);

  // Move-only, and the destructor removes an uncommitted temporary file: both come from file_.
  const std::string& temp_path() const { return file_.temp_path(); }
  // Writes this rank's rows of tensor `index` (laid out as RowSelection says over its shape).
  void write_rows(size_t index, const RowSelection& rows, const float* data);
  void finish();  // flushes and closes; every rank calls it before the barrier
  void commit();  // after every rank finished: renames to the final path
  void discard();

 private:
  SafetensorsOutput() = default;

  npy_internal::TempOutputFile file_;  // the temporary file's lifecycle, shared with NpyOutput
  std::string header_;
  std::vector<SafetensorsEntry> tensors_;
  std::vector<int64_t> offsets_;
  int64_t total_bytes_ = 0;
};

}  // namespace ringattn
