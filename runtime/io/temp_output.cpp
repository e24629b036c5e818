#include "runtime/io/temp_output.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <random>
#include <stdexcept>
#include <utility>

#include "runtime/errors.hpp"
#include "runtime/io/npy_file.hpp"
#include "runtime/io/temp_files.hpp"

namespace ringattn::npy_internal {

TempOutputFile TempOutputFile::create(const std::string& path, const std::string& label) {
  const std::string where = where_of(label, path);
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) throw usage_error(where + "is a directory");

  TempOutputFile out;
  out.path_ = path;
  out.label_ = label;
  // Unique among ranks, jobs and hosts writing the same path; O_EXCL makes sure of it.
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
    if (is_usage_errno(e)) throw usage_error(msg);
    throw Fault(msg);
  }
  out.owner_ = true;  // from here on, a throw removes the temporary file
  return out;
}

TempOutputFile TempOutputFile::open(const std::string& path, const std::string& temp_path, const std::string& label) {
  TempOutputFile out;
  out.path_ = path;
  out.temp_path_ = temp_path;
  out.label_ = label;
  out.fd_ = ::open(temp_path.c_str(), O_RDWR | O_CLOEXEC);
  if (out.fd_ < 0)
    throw Fault(out.where() + "cannot open the temporary file another rank created: " + std::strerror(errno));
  return out;
}

TempOutputFile::TempOutputFile(TempOutputFile&& other) noexcept { *this = std::move(other); }

TempOutputFile& TempOutputFile::operator=(TempOutputFile&& other) noexcept {
  if (this == &other) return *this;
  release();
  path_ = std::move(other.path_);
  temp_path_ = std::move(other.temp_path_);
  label_ = std::move(other.label_);
  fd_ = std::exchange(other.fd_, -1);
  owner_ = std::exchange(other.owner_, false);
  committed_ = other.committed_;
  return *this;
}

TempOutputFile::~TempOutputFile() { release(); }

void TempOutputFile::release() {
  if (fd_ >= 0) ::close(std::exchange(fd_, -1));
  if (std::exchange(owner_, false) && !committed_) {
    ::unlink(temp_path_.c_str());
    temp_files::forget(temp_path_);
  }
}

std::string TempOutputFile::where() const { return where_of(label_, path_) + "(writing " + temp_path_ + ") "; }

int TempOutputFile::write_header_and_reserve(const std::string& header, int64_t total) {
  pwrite_all(fd_, header.data(), static_cast<int64_t>(header.size()), 0, where());
  int rc = ::posix_fallocate(fd_, 0, total);
  if (rc == EOPNOTSUPP) rc = ::ftruncate(fd_, total) == 0 ? 0 : errno;  // no reservation on this file system
  return rc;
}

void TempOutputFile::write_rows(int64_t data_offset, int64_t elements, const RowSelection& rows, const float* data,
                                const std::string& what) {
  if (fd_ < 0) throw std::logic_error(where() + "write_rows after finish, commit or discard");
  for_each_run(rows, elements, what, [&](int64_t file_element, int64_t buffer_element, int64_t n) {
    pwrite_all(fd_, data + buffer_element, n * 4, data_offset + file_element * 4, what);
  });
}

void TempOutputFile::finish() {
  if (fd_ < 0) return;
  const int fd = std::exchange(fd_, -1);
  if (::fsync(fd) != 0) {
    const int e = errno;
    ::close(fd);
    throw Fault(where() + "flushing to disk failed: " + std::strerror(e));
  }
  if (::close(fd) != 0 && errno != EINTR) throw Fault(where() + "closing failed: " + std::strerror(errno));
}

void TempOutputFile::commit() {
  if (committed_) return;
  try {
    finish();
    if (::rename(temp_path_.c_str(), path_.c_str()) != 0)
      throw Fault(where() + "cannot rename to the final path: " + std::strerror(errno));
  } catch (...) {
    discard();
    throw;
  }
  committed_ = true;
  temp_files::forget(temp_path_);
}

void TempOutputFile::discard() {
  if (fd_ >= 0) ::close(std::exchange(fd_, -1));
  if (!committed_ && !temp_path_.empty()) {
    ::unlink(temp_path_.c_str());
    temp_files::forget(temp_path_);
  }
}

}  // namespace ringattn::npy_internal
