#include "launch/cli/context.hpp"

#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "runtime/errors.hpp"
#include "runtime/io/temp_files.hpp"

namespace ringattn {

void write_text_file(const std::string& path, const std::string& label, const std::string& text) {
  const std::string temp = path + ".tmp-" + std::to_string(getpid());
  temp_files::add(temp);  // removed by a fatal signal (launch/main.cpp) until renamed
  struct Forget {
    const std::string& path;
    ~Forget() { temp_files::forget(path); }
  } forget{temp};
  const int fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) throw usage_error(label + " " + path + ": cannot create (" + std::strerror(errno) + ")");
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n <= 0) {
      const int err = errno;
      ::close(fd);
      ::unlink(temp.c_str());
      throw Fault(label + " " + path + ": write failed (" + std::strerror(err) + ")");
    }
    done += static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0 || ::close(fd) != 0 || ::rename(temp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    ::unlink(temp.c_str());
    throw Fault(label + " " + path + ": could not be completed (" + std::strerror(err) + ")");
  }
}

uint64_t peak_rss_bytes() {
  struct rusage ru {};
  getrusage(RUSAGE_SELF, &ru);
  return static_cast<uint64_t>(ru.ru_maxrss) * 1024;  // Linux reports KiB
}

}  // namespace ringattn
