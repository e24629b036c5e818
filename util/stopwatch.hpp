// Monotonic time in seconds, for timeouts, emulated links and measurements (every layer).
#pragma once

#include <chrono>

namespace ringattn {

// Seconds on std::chrono::steady_clock (never jumps with the wall clock) from an arbitrary origin.
inline double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

class Stopwatch {
 public:
  Stopwatch() : start_(now_seconds()) {}
  void restart() { start_ = now_seconds(); }
  double seconds() const { return now_seconds() - start_; }

 private:
  double start_;
};

}  // namespace ringattn
