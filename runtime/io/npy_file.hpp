// Internals shared by the .npy reader and writer (runtime/io/npy.cpp, runtime/io/npy_rows.cpp):
// messages, dtypes and checked file access. Not part of the runtime's interface: use npy.hpp.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/io/npy.hpp"

namespace ringattn::npy_internal {

// "--q /data/q.npy: ", the start of every message about a file.
std::string where_of(const std::string& label, const std::string& path);
// As Python prints it: (), (5,), (2, 3).
std::string format_shape(const std::vector<int64_t>& shape);
// "4.1 TB", decimal units.
std::string human_bytes(double bytes);
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

// Opens a regular file to read and gives its size; UsageError when it cannot be used.
int open_input(const std::string& path, int64_t* size, const std::string& where);
// Whole reads and writes at an offset, retried until done; RuntimeFault on failure.
void pread_all(int fd, void* buffer, int64_t bytes, int64_t offset, const std::string& where);
void pwrite_all(int fd, const void* buffer, int64_t bytes, int64_t offset, const std::string& where);
// inspect_npy on an open file.
NpyInfo inspect_open(int fd, int64_t file_size, const std::string& path, const std::string& label);

}  // namespace ringattn::npy_internal
