// NumPy .npy files (docs/reference.md "Tensors and files"): a header parser that refuses bad input with
// a message naming the file, shard readers that read only a rank's own rows, and an output file
// that every rank fills with its own rows and that appears at its final path only when complete.
//
// Every message starts with the caller's label and the path ("--q /data/q.npy: ..."); bad input
// throws ArgumentError (exit 2), an I/O failure at run time throws Fault (exit 4).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/io/temp_output.hpp"

namespace ringattn {

// What a validated header says. The file holds at least data_offset + bytes() bytes.
struct NpyInfo {
  std::string path;
  std::string label;           // the option that named the file, e.g. "--q"; may be empty
  std::string descr;           // "<f4", "<f8", "<f2", "<i8", "<i4", "|u1" or "|b1"
  std::vector<int64_t> shape;  // C order; () is a scalar
  int64_t data_offset = 0;     // bytes before the data: preamble + header
  int64_t word_size = 0;       // bytes per element

  int64_t elements() const;
  int64_t bytes() const { return elements() * word_size; }
};

// Parses and validates the beginning of a .npy file held in memory: `head` is the first bytes
// of the file (at least the whole header), `file_size` the size of the whole file.
NpyInfo parse_npy_header(std::string_view head, int64_t file_size, const std::string& path,
                         const std::string& label);

// Opens `path`, validates its header and checks that the file holds all the data it claims.
NpyInfo inspect_npy(const std::string& path, const std::string& label);

// The rows a rank owns of a tensor viewed as 3-D (outer, seq, inner): for every outer index,
// the rows at `positions` (strictly ascending, in [0, seq)). Q (B, L, H, D) is
// (B, L, H*D); LSE (B, H, L) is (B*H, L, 1). Buffers of selected rows are laid out
// (outer, positions.size(), inner).
struct RowSelection {
  int64_t outer = 1;
  int64_t seq = 0;
  int64_t inner = 1;
  std::span<const int64_t> positions;

  int64_t elements() const { return outer * static_cast<int64_t>(positions.size()) * inner; }
};

// The selection of `positions` along axis `seq_axis` of an array of this shape.
RowSelection rows_along(const std::vector<int64_t>& shape, int seq_axis, std::span<const int64_t> positions);

// Reads the selected rows of a float file into `out` (rows.elements() floats). Consecutive
// positions are read with one pread each. float64 and float16 files are converted to float32;
// then, when `note` is given, it receives a line to print once ("--q x.npy: converted ...").
void read_npy_rows(const NpyInfo& info, const RowSelection& rows, float* out, std::string* note = nullptr);

// Whole small arrays (doc lengths, block masks, weights). `shape` receives the file's shape.
std::vector<float> read_npy_float(const std::string& path, const std::string& label, std::vector<int64_t>* shape,
                                  std::string* note = nullptr);
// int64 ('<i8'); int32 ('<i4') is widened.
std::vector<int64_t> read_npy_int64(const std::string& path, const std::string& label,
                                    std::vector<int64_t>* shape);
// uint8 ('|u1') or bool ('|b1'), bytes as stored.
std::vector<uint8_t> read_npy_u8(const std::string& path, const std::string& label, std::vector<int64_t>* shape);

// The exact bytes NumPy writes before the data of an array of this descr and shape
// (version 1.0 when the header fits, else 2.0; padded with spaces and '\n' to a multiple of 64).
std::string npy_header_bytes(const std::string& descr, const std::vector<int64_t>& shape);

// A float32 output file shared by all ranks, written under a temporary name next to the final
// path and renamed into place only when every rank has written its rows:
//   one rank:    auto out = NpyOutput::create(path, "--out", shape);   // header + full size reserved
//                send out.temp_path() to the others
//   other ranks: auto out = NpyOutput::open(path, temp_path, "--out", shape);
//   every rank:  out.write_rows(rows, data); out.finish();               // data on disk, errors seen
//   barrier (the caller's: this module knows nothing of MPI)
//   one rank:    out.commit();                                           // rename to the final path
// A creator destroyed before commit() removes the temporary file, so a failed run never leaves
// a file at the final path. (A killed process leaves `<path>.tmp-*` behind, never `<path>`.)
class NpyOutput {
 public:
  // Creates `<path>.tmp-<unique>`, writes the header and reserves the whole size, so that a full
  // disk fails here rather than leaving a short file.
  static NpyOutput create(const std::string& path, const std::string& label, const std::vector<int64_t>& shape);
  // Opens the temporary file another rank created, checking its header against `shape`.
  static NpyOutput open(const std::string& path, const std::string& temp_path, const std::string& label,
                        const std::vector<int64_t>& shape);

  // Move-only, and the destructor removes an uncommitted temporary file: both come from file_.
  const std::string& path() const { return file_.path(); }
  const std::string& temp_path() const { return file_.temp_path(); }
  const std::vector<int64_t>& shape() const { return shape_; }

  // Writes this rank's rows (laid out as RowSelection says), one pwrite per run of consecutive
  // positions; a short or failed write throws Fault.
  void write_rows(const RowSelection& rows, const float* data);
  // Flushes this rank's writes to disk and closes the file. On shared file systems a full disk
  // or quota is often reported only here, so every rank calls it before the barrier.
  void finish();
  // After every rank finished: makes the file durable and renames it to the final path.
  void commit();
  // Removes the temporary file (idempotent); after it the output is gone.
  void discard();

 private:
  friend void write_npy_whole(const std::string&, const std::string&, const std::string&,
                              const std::vector<int64_t>&, const void*);
  NpyOutput() = default;
  static NpyOutput create_as(const std::string& descr, const std::string& path, const std::string& label,
                             const std::vector<int64_t>& shape);
  std::string where() const;

  npy_internal::TempOutputFile file_;  // the temporary file's lifecycle, shared with SafetensorsOutput
  std::vector<int64_t> shape_;
  int64_t data_offset_ = 0;
  int64_t data_bytes_ = 0;
};

// Writes a whole small float32 array to `path` atomically (temporary file, then rename).
void write_npy(const std::string& path, const std::string& label, const std::vector<int64_t>& shape,
               const float* data);
// The same for a uint8 array ('|u1'), e.g. the block mask actually used.
void write_npy_u8(const std::string& path, const std::string& label, const std::vector<int64_t>& shape,
                  const uint8_t* data);

}  // namespace ringattn
