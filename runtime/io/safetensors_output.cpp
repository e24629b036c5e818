#include "runtime/io/safetensors_output.hpp"

#include <cstring>

#include "runtime/errors.hpp"
#include "runtime/io/npy_file.hpp"

namespace ringattn {

using namespace npy_internal;

namespace {

int64_t elements_of(const SafetensorsEntry& t) {
  int64_t n = 1;
  for (int64_t d : t.shape) n *= d;
  return n;
}

}  // namespace

SafetensorsOutput SafetensorsOutput::create(const std::string& path, const std::string& label,
                                            const std::vector<SafetensorsEntry>& tensors, const Metadata& metadata) {
  SafetensorsOutput out;
  out.tensors_ = tensors;
  out.header_ = safetensors_header_bytes(tensors, metadata, &out.offsets_);
  out.total_bytes_ = int64_t(out.header_.size());
  for (const SafetensorsEntry& t : tensors) out.total_bytes_ += 4 * elements_of(t);
  out.file_ = TempOutputFile::create(path, label);
  if (const int rc = out.file_.write_header_and_reserve(out.header_, out.total_bytes_))
    throw Fault(out.file_.where() + "cannot reserve " + std::to_string(out.total_bytes_) +
                       " bytes: " + std::strerror(rc));
  return out;
}

SafetensorsOutput SafetensorsOutput::open(const std::string& path, const std::string& temp_path,
                                          const std::string& label, const std::vector<SafetensorsEntry>& tensors,
                                          const Metadata& metadata) {
  SafetensorsOutput out;
  out.tensors_ = tensors;
  out.header_ = safetensors_header_bytes(tensors, metadata, &out.offsets_);
  out.file_ = TempOutputFile::open(path, temp_path, label);
  // The ranks must agree on what they write; another header is a fault between them.
  std::string header(out.header_.size(), '\0');
  pread_all(out.file_.fd(), header.data(), int64_t(header.size()), 0, out.file_.where());
  if (header != out.header_) throw Fault(out.file_.where() + "the temporary file has another header");
  return out;
}

void SafetensorsOutput::write_rows(size_t index, const RowSelection& rows, const float* data) {
  const std::string what = file_.where() + "tensor \"" + tensors_.at(index).name + "\": ";
  file_.write_rows(offsets_[index], elements_of(tensors_[index]), rows, data, what);
}

void SafetensorsOutput::finish() { file_.finish(); }

void SafetensorsOutput::commit() { file_.commit(); }

void SafetensorsOutput::discard() { file_.discard(); }

}  // namespace ringattn
