#include "runtime/io/temp_files.hpp"

#include <unistd.h>

#include <atomic>
#include <cstring>

namespace ringattn::temp_files {
namespace {

// A slot is free (0), being filled by its owner (1), or holds a path (2). A signal handler reads
// only slots in state 2, whose path is complete. (launch/main.cpp runs the handler on the main
// thread, the one that adds and forgets paths, so a path cannot change while it is read.)
enum : int { kFree = 0, kBusy = 1, kHeld = 2 };

struct Slot {
  std::atomic<int> state{kFree};
  char path[kPathBytes];
};
static_assert(std::atomic<int>::is_always_lock_free, "signal handlers need lock-free atomics");

Slot slots[kSlots];

}  // namespace

void add(const std::string& path) {
  if (path.empty() || path.size() >= kPathBytes) return;
  for (Slot& s : slots) {
    int expected = kFree;
    if (!s.state.compare_exchange_strong(expected, kBusy)) continue;
    std::memcpy(s.path, path.c_str(), path.size() + 1);
    s.state.store(kHeld, std::memory_order_release);
    return;
  }
}

void forget(const std::string& path) {
  for (Slot& s : slots) {
    if (s.state.load(std::memory_order_acquire) != kHeld || path != s.path) continue;
    s.state.store(kFree, std::memory_order_release);
    return;
  }
}

int remove_all() noexcept {
  int removed = 0;
  for (Slot& s : slots) {
    if (s.state.load(std::memory_order_acquire) != kHeld) continue;
    ::unlink(s.path);
    ++removed;
  }
  return removed;
}

}  // namespace ringattn::temp_files
