#include "runtime/io/safetensors_output.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <random>
#include <stdexcept>
#include <utility>

#include "runtime/errors.hpp"
#include "runtime/io/npy_file.hpp"
#include "runtime/io/temp_files.hpp"

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
  const std::string where = where_of(label, path);
  SafetensorsOutput out;
  out.path_ = path, out.label_ = label, out.tensors_ = tensors;
  out.header_ = safetensors_header_bytes(tensors, metadata, &out.offsets_);
  out.total_bytes_ = int64_t(out.header_.size());
  for (const SafetensorsEntry& t : tensors) out.total_bytes_ += 4 * elements_of(t);
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) throw UsageError(where + "is a directory");
  std::random_device entropy;
  char suffix[64];
  std::snprintf(suffix, sizeof suffix, ".tmp-%08x%08x-%d", entropy(), entropy(), static_cast<int>(::getpid()));
  out.temp_path_ = path + suffix;
  temp_files::add(out.temp_path_);  // before it exists, so that a signal never misses it
  out.fd_ = ::open(out.temp_path_.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
  if (out.fd_ < 0) {
    const int e = errno;
    temp_files::forget(out.temp_path_);
    const std::string msg = where + "cannot create " + out.temp_path_ + ": " + std::strerror(e);
    if (is_usage_errno(e)) throw UsageError(msg);
    throw RuntimeFault(msg);
  }
  out.owner_ = true;
  pwrite_all(out.fd_, out.header_.data(), int64_t(out.header_.size()), 0, out.where());
  int rc = ::posix_fallocate(out.fd_, 0, out.total_bytes_);
  if (rc == EOPNOTSUPP) rc = ::ftruncate(out.fd_, out.total_bytes_) == 0 ? 0 : errno;
  if (rc) throw RuntimeFault(out.where() + "cannot reserve " + std::to_string(out.total_bytes_) + " bytes: " + std::strerror(rc));
  return out;
}

SafetensorsOutput SafetensorsOutput::open(const std::string& path, const std::string& temp_path,
                                          const std::string& label, const std::vector<SafetensorsEntry>& tensors,
                                          const Metadata& metadata) {
  SafetensorsOutput out;
  out.path_ = path, out.temp_path_ = temp_path, out.label_ = label, out.tensors_ = tensors;
  out.header_ = safetensors_header_bytes(tensors, metadata, &out.offsets_);
  out.fd_ = ::open(temp_path.c_str(), O_RDWR | O_CLOEXEC);
  if (out.fd_ < 0)
    throw RuntimeFault(out.where() + "cannot open the temporary file another rank created: " + std::strerror(errno));
  // The ranks must agree on what they write; another header is a fault between them.
  std::string header(out.header_.size(), '\0');
  pread_all(out.fd_, header.data(), int64_t(header.size()), 0, out.where());
  if (header != out.header_) throw RuntimeFault(out.where() + "the temporary file has another header");
  return out;
}

SafetensorsOutput::SafetensorsOutput(SafetensorsOutput&& other) noexcept { *this = std::move(other); }

SafetensorsOutput& SafetensorsOutput::operator=(SafetensorsOutput&& other) noexcept {
  if (this == &other) return *this;
  release();
  path_ = std::move(other.path_), temp_path_ = std::move(other.temp_path_), label_ = std::move(other.label_);
  header_ = std::move(other.header_), tensors_ = std::move(other.tensors_), offsets_ = std::move(other.offsets_);
  total_bytes_ = other.total_bytes_;
  fd_ = std::exchange(other.fd_, -1);
  owner_ = std::exchange(other.owner_, false);
  committed_ = other.committed_;
  return *this;
}

SafetensorsOutput::~SafetensorsOutput() { release(); }

void SafetensorsOutput::release() {
  if (fd_ >= 0) ::close(std::exchange(fd_, -1));
  if (std::exchange(owner_, false) && !committed_) {
    ::unlink(temp_path_.c_str());
    temp_files::forget(temp_path_);
  }
}

std::string SafetensorsOutput::where() const { return where_of(label_, path_) + "(writing " + temp_path_ + ") "; }

void SafetensorsOutput::write_rows(size_t index, const RowSelection& rows, const float* data) {
  if (fd_ < 0) throw std::logic_error(where() + "write_rows after finish, commit or discard");
  const std::string what = where() + "tensor \"" + tensors_.at(index).name + "\": ";
  const int64_t base = offsets_[index];
  for_each_run(rows, elements_of(tensors_[index]), what, [&](int64_t file_element, int64_t buffer_element, int64_t n) {
    pwrite_all(fd_, data + buffer_element, n * 4, base + file_element * 4, what);
  });
}

void SafetensorsOutput::finish() {
  if (fd_ < 0) return;
  const int fd = std::exchange(fd_, -1);
  if (::fsync(fd) != 0) {
    const int e = errno;
    ::close(fd);
    throw RuntimeFault(where() + "flushing to disk failed: " + std::strerror(e));
  }
  if (::close(fd) != 0 && errno != EINTR) throw RuntimeFault(where() + "closing failed: " + std::strerror(errno));
}

void SafetensorsOutput::commit() {
  if (committed_) return;
  try {
    finish();
    if (::rename(temp_path_.c_str(), path_.c_str()) != 0)
      throw RuntimeFault(where() + "cannot rename to the final path: " + std::strerror(errno));
  } catch (...) {
    discard();
    throw;
  }
  committed_ = true;
  temp_files::forget(temp_path_);
}

void SafetensorsOutput::discard() {
  if (fd_ >= 0) ::close(std::exchange(fd_, -1));
  if (!committed_ && !temp_path_.empty()) {
    ::unlink(temp_path_.c_str());
    temp_files::forget(temp_path_);
  }
}

}  // namespace ringattn
