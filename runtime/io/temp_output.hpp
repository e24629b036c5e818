// The one implementation behind NpyOutput (npy.hpp) and SafetensorsOutput (safetensors_output.hpp):
// a file shared by all ranks, written under `<path>.tmp-<unique>` and renamed into place only when
// every rank has written, so that a failed run never leaves a file at the final path. The formats
// differ only in their header and in where each array's data starts; this class holds the rest:
// the temporary name, its registration with temp_files, the row writes, flush, rename and removal.
#pragma once

#include <cstdint>
#include <string>

namespace ringattn {
struct RowSelection;  // npy.hpp, which includes this file
}  // namespace ringattn

namespace ringattn::npy_internal {

class TempOutputFile {
 public:
  TempOutputFile() = default;  // nothing open; the formats fill it through create() or open()
  // Creates the temporary file (O_EXCL) next to `path`; a directory at `path` is a ArgumentError.
  static TempOutputFile create(const std::string& path, const std::string& label);
  // Opens the temporary file another rank created.
  static TempOutputFile open(const std::string& path, const std::string& temp_path, const std::string& label);

  TempOutputFile(TempOutputFile&& other) noexcept;
  TempOutputFile& operator=(TempOutputFile&& other) noexcept;
  TempOutputFile(const TempOutputFile&) = delete;
  TempOutputFile& operator=(const TempOutputFile&) = delete;
  ~TempOutputFile();

  const std::string& path() const { return path_; }
  const std::string& temp_path() const { return temp_path_; }
  int fd() const { return fd_; }
  bool committed() const { return committed_; }
  std::string where() const;  // "<label> <path>: (writing <temp>) ", the prefix of every message

  // Writes the header and reserves `total` bytes, so that a full disk fails here rather than
  // leaving a short file. Returns 0 or the errno of the reservation (each format words its own
  // message); a failed header write throws.
  int write_header_and_reserve(const std::string& header, int64_t total);
  // Writes this rank's rows of one float32 array of `elements` elements whose data starts at
  // byte `data_offset`, one pwrite per run of consecutive positions; `what` prefixes errors.
  void write_rows(int64_t data_offset, int64_t elements, const RowSelection& rows, const float* data,
                  const std::string& what);
  void finish();   // fsync and close (idempotent)
  void commit();   // finish, then rename to the final path; on failure the temporary file is removed
  void discard();  // closes and removes the temporary file (idempotent)

 private:
  void release();  // closes; a creator that did not commit removes the temporary file

  std::string path_, temp_path_, label_;
  int fd_ = -1;
  bool owner_ = false;  // created the temporary file: removes it unless committed
  bool committed_ = false;
};

}  // namespace ringattn::npy_internal
