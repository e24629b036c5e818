// Internals shared by the .npy reader and writer (runtime/io/npy.cpp, runtime/io/npy_rows.cpp) and
// the safetensors reader (runtime/io/safetensors.cpp):
// messages, dtypes and checked file access. Not part of the runtime's interface: use npy.hpp.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/io/npy.hpp"
#include "util/dtype.hpp"
#include "util/format.hpp"

namespace ringattn::npy_internal {

// "--q /data/q.npy: ", the start of every message about a file.
std::string where_of(const std::string& label, const std::string& path);
// The data size of an array of this shape, or -1 when a dimension is negative or it overflows.
int64_t byte_count(const std::vector<int64_t>& shape, int64_t word_size);
// Errors of open() that mean the user named a file that cannot be used, as opposed to a fault.
bool is_usage_errno(int error);

struct DTypeInfo {
  std::string_view descr;  // as NpyInfo reports it: byte order '<', or '|' for one-byte types
  std::string_view name;   // "float32"
  int64_t word_size;
};
const DTypeInfo* find_dtype(std::string_view descr);  // nullptr when not one we read
std::string_view dtype_name(std::string_view descr);  // "float32", or descr itself

// A file descriptor closed on scope exit.
struct FileHandle {
  int fd = -1;
  FileHandle() = default;
  explicit FileHandle(int f) : fd(f) {}
  FileHandle(const FileHandle&) = delete;
  FileHandle& operator=(const FileHandle&) = delete;
  ~FileHandle();
};

// Opens a regular file to read and gives its size; ArgumentError when it cannot be used.
int open_input(const std::string& path, int64_t* size, const std::string& where);
// Whole reads and writes at an offset, retried until done; Fault on failure.
void pread_all(int fd, void* buffer, int64_t bytes, int64_t offset, const std::string& where);
void pwrite_all(int fd, const void* buffer, int64_t bytes, int64_t offset, const std::string& where);
// Calls fn(file_element, buffer_element, elements) for each maximal run of the selection that is
// contiguous both in the file and in the buffer (so a full-sequence selection is one run).
template <class Fn>
void for_each_run(const RowSelection& rows, int64_t file_elements, const std::string& where, Fn&& fn) {
  const int64_t count = static_cast<int64_t>(rows.positions.size());
  int64_t total = 0;
  if (rows.outer < 0 || rows.seq < 0 || rows.inner < 0 || __builtin_mul_overflow(rows.outer, rows.seq, &total) ||
      __builtin_mul_overflow(total, rows.inner, &total) || total != file_elements)
    throw std::invalid_argument(where + "cannot view " + std::to_string(file_elements) + " elements as (outer, seq, inner) = (" +
                                std::to_string(rows.outer) + ", " + std::to_string(rows.seq) + ", " +
                                std::to_string(rows.inner) + ")");
  for (int64_t k = 0; k < count; ++k)
    if (rows.positions[k] < 0 || rows.positions[k] >= rows.seq || (k && rows.positions[k] <= rows.positions[k - 1]))
      throw std::invalid_argument(where + "row positions must be strictly ascending in [0, " + std::to_string(rows.seq) + ")");
  int64_t run_file = 0, run_buffer = 0, run_elements = 0;
  for (int64_t o = 0; o < rows.outer; ++o) {
    for (int64_t k = 0; k < count;) {
      int64_t n = 1;
      while (k + n < count && rows.positions[k + n] == rows.positions[k] + n) ++n;
      const int64_t file = (o * rows.seq + rows.positions[k]) * rows.inner, buffer = (o * count + k) * rows.inner;
      if (run_elements && run_file + run_elements == file && run_buffer + run_elements == buffer) {
        run_elements += n * rows.inner;
      } else {
        if (run_elements) fn(run_file, run_buffer, run_elements);
        run_file = file, run_buffer = buffer, run_elements = n * rows.inner;
      }
      k += n;
    }
  }
  if (run_elements) fn(run_file, run_buffer, run_elements);
}

// IEEE binary16 bits -> float (exact: every half is a float).
// inspect_npy on an open file.
NpyInfo inspect_open(int fd, int64_t file_size, const std::string& path, const std::string& label);

}  // namespace ringattn::npy_internal
